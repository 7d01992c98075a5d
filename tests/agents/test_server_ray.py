"""The session server on real Ray (engines and the server as actors), driven by the official openai client
and raw HTTP: plain and streamed chat, multi-turn sessions that keep their engine across a weight publication
with each token tagged with its lease's version, many concurrent sessions, the sealed gate, the router at its
cap, an over-long context, a client that disconnects mid-stream, a concurrent request on one session."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import openai
import pytest

from agents.chat import STOP
from agents.trajectory import Trajectory

from .stack import KEY, await_for, engines, publish, server

pytestmark = pytest.mark.slow
VERSION = itertools.count(1)  # publications on the module's engines, in order


@pytest.fixture(scope="module")
def stack(ray_driver):
    handles = engines(ray_driver, ["e0", "e1"])
    srv, url = server(handles)
    yield ray_driver, handles, srv, url
    for h in [srv, *handles.values()]:
        ray_driver.kill(h)


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)


async def _snap(handle) -> dict:
    return await handle.snapshot.remote()


def test_openai_client_plain_and_stream_and_models(stack) -> None:
    ray, handles, srv, url = stack

    async def main() -> None:
        client = _client(url)
        msgs = [{"role": "user", "content": "hello"}]
        plain = await client.chat.completions.create(model="x", messages=msgs, max_tokens=5, temperature=0)
        assert plain.object == "chat.completion" and plain.choices[0].finish_reason in ("stop", "length")
        assert isinstance(plain.choices[0].message.content, str) and plain.usage.completion_tokens >= 1
        # Sampled with the stop token barred: a policy that samples it first streams no content chunk (about 1
        # request in 100 of a young policy: tests/execution/test_agents_live.py).
        no_stop = {str(STOP): -100}
        stream = await client.chat.completions.create(
            model="x", messages=msgs, max_tokens=5, stream=True, logit_bias=no_stop
        )
        chunks = [c async for c in stream]
        assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "length"
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert len(chunks) >= 3 and isinstance(text, str)
        again = await client.chat.completions.create(model="x", messages=msgs, max_tokens=5, temperature=0)
        assert again.choices[0].message.content == plain.choices[0].message.content  # greedy, fresh session
        models = await client.models.list()
        assert models.data[0].id.startswith("run-1@v")
        completion = await client.completions.create(model="x", prompt="abc", max_tokens=3, logit_bias=no_stop)
        assert completion.choices[0].finish_reason == "length" and completion.usage.completion_tokens == 3
        stats = await srv.stats.remote()
        assert stats["sessions"] == 0 and stats["requests"] >= 4  # one-off sessions ended with their answers

    asyncio.run(main())


def test_session_keeps_its_engine_across_a_publication_and_tags_versions(stack) -> None:
    ray, handles, srv, url = stack

    async def main() -> None:
        client = _client(url)
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one"}]
        extra = {"session_id": "pub-1"}
        versions = []
        for turn in range(3):
            answer = await client.chat.completions.create(model="x", messages=msgs, max_tokens=4, extra_body=extra)
            versions.append(answer.model_extra["rl"]["version"])
            msgs += [
                {"role": "assistant", "content": answer.choices[0].message.content},
                {"role": "user", "content": f"t{turn}"},
            ]
            if turn == 0:
                await publish(handles, next(VERSION))
        record = Trajectory.model_validate(await srv.trajectory.remote("pub-1"))
        assert record.kind == "external" and len(record.segments) == 3
        assert len({s.engine for s in record.segments}) == 1  # never moved
        assert versions[1] == versions[0] + 1 == versions[2]
        for seg, v in zip(record.segments, versions):
            assert seg.versions == [v] * len(seg.completion_ids)  # each token: its lease's version
        async with httpx.AsyncClient() as http:
            got = await http.get(f"{url}/v1/sessions/pub-1/trajectory", headers={"Authorization": f"Bearer {KEY}"})
        assert Trajectory.model_validate(got.json()) == record
        ended = await srv.end_session.remote("pub-1")
        assert ended.state == "ended" and ended.segments == record.segments

    asyncio.run(main())


def test_sixteen_concurrent_sessions_of_three_turns(stack) -> None:
    ray, handles, srv, url = stack

    async def session(client: openai.AsyncOpenAI, i: int) -> list[str]:
        msgs, engines_seen = [{"role": "user", "content": f"s{i}"}], []
        for _turn in range(3):
            a = await client.chat.completions.create(
                model="x", messages=msgs, max_tokens=3, extra_headers={"X-Session-Id": f"c-{i}"}
            )
            engines_seen.append(a.model_extra["rl"]["engine"])
            msgs += [{"role": "assistant", "content": a.choices[0].message.content}, {"role": "user", "content": "go"}]
        return engines_seen

    async def main() -> None:
        client = _client(url)
        seen = await asyncio.gather(*(session(client, i) for i in range(16)))
        assert all(len(set(s)) == 1 for s in seen)  # sticky
        assert {s[0] for s in seen} == {"e0", "e1"}  # balanced over both engines
        stats = await srv.stats.remote()
        assert sum(stats["sessions_per_engine"].values()) == 16
        for i in range(16):
            assert len((await srv.end_session.remote(f"c-{i}")).segments) == 3

    asyncio.run(main())


def test_a_groups_sessions_open_and_end_in_one_call_each_over_the_workers_aiohttp_client(stack) -> None:
    """As a rollout worker runs a group (trainer/agent_episodes.py): `open_sessions` opens them all or none,
    the episodes run on the client a worker builds (the openai package's aiohttp transport), and `end_sessions`
    returns the records in order and frees every binding and every engine cache."""
    from trainer.agent_episodes import Serving, openai_client

    ray, handles, srv, url = stack
    sids = [f"grp-{k}" for k in range(4)]

    def held(stats: dict) -> tuple[int, int]:
        return stats["sessions"], sum(stats["sessions_per_engine"].values())

    async def cached() -> int:
        return sum([(await _snap(h))["sessions"] for h in handles.values()])

    async def main() -> None:
        before, in_engines = held(await srv.stats.remote()), await cached()
        await srv.open_sessions.remote(sids)
        with pytest.raises(ray.exceptions.RayTaskError, match="already exists"):
            await srv.open_sessions.remote(["grp-new", "grp-2"])
        client = openai_client(Serving(srv, url, KEY))
        assert type(client._client).__name__ == "_InstalledAioHttpClient"

        async def episode(sid: str) -> str:
            msgs = [{"role": "user", "content": sid}]
            answer = await client.chat.completions.create(
                model="x", messages=msgs, max_tokens=3, extra_body={"session_id": sid}
            )
            return answer.choices[0].message.content

        await asyncio.gather(*(episode(sid) for sid in sids))
        records = await srv.end_sessions.remote(sids)
        assert [r.session_id for r in records] == sids
        assert all(r.kind == "internal" and r.state == "ended" and len(r.segments) == 1 for r in records)
        assert held(await srv.stats.remote()) == before  # records and router bindings all freed
        assert await cached() == in_engines  # and the engines' caches (one end_sessions call per engine)
        with pytest.raises(ray.exceptions.RayTaskError, match="grp-0"):
            await srv.end_sessions.remote(sids)  # ended already; "grp-new" was never opened either
        await client.close()

    asyncio.run(main())


def test_a_workers_groups_open_all_or_none_and_end_in_one_call_with_an_outcome_each(stack) -> None:
    """A rollout worker opens sessions with `open_sessions` (all or none: a taken id opens none of the call's) and
    ends its groups through `end_many` (rollout/coalesce.py): the groups ending together travel as one call; each
    gets its own outcome (an unknown id fails only its group, which ends none of its sessions); the engines'
    caches are freed."""
    from rollout.coalesce import CallCoalescer

    ray, handles, srv, url = stack
    groups = [["many-0", "many-1"], ["many-2"], ["many-3", "many-1"]]  # the third reuses a taken id

    async def cached() -> int:
        return sum([(await _snap(h))["sessions"] for h in handles.values()])

    async def main() -> None:
        in_engines = await cached()
        ends = CallCoalescer(srv, "end_many")
        opened = [await asyncio.gather(srv.open_sessions.remote(g), return_exceptions=True) for g in groups]
        assert opened[:2] == [[None], [None]] and isinstance(opened[2][0], ray.exceptions.RayTaskError)
        assert "many-1" in str(opened[2][0])
        with pytest.raises(ray.exceptions.RayTaskError, match="many-3"):
            await srv.trajectory.remote("many-3")  # none of the failed group's sessions opened
        client = _client(url)
        for sid in ("many-0", "many-1", "many-2"):
            msgs = [{"role": "user", "content": sid}]
            await client.chat.completions.create(model="x", messages=msgs, max_tokens=2, extra_body={"session_id": sid})
        assert await cached() == in_engines + 3
        ending = [["many-0", "many-1"], ["many-2", "nope"]]
        ended = await asyncio.gather(*(ends.submit(g) for g in ending), return_exceptions=True)
        assert ends.stats() == {"calls": 1, "requests": 2}
        assert [r.session_id for r in ended[0]] == ["many-0", "many-1"] and all(r.state == "ended" for r in ended[0])
        assert isinstance(ended[1], KeyError) and "nope" in str(ended[1])
        assert await cached() == in_engines + 1  # many-2 is still open: its group failed as a whole
        [[record]] = await srv.end_many.remote([["many-2"]])
        assert record.session_id == "many-2" and await cached() == in_engines
        await client.close()

    asyncio.run(main())


def test_request_at_a_sealed_gate_is_admitted_at_reopen_under_the_new_version(stack) -> None:
    ray, handles, srv, url = stack

    async def main() -> None:
        from rollout.publication import PublicationController

        pc = PublicationController(handles)
        await pc.prepare(timeout_s=20)
        client = _client(url)
        late = asyncio.ensure_future(
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        )

        async def waiting() -> bool:
            return sum([(await _snap(h))["waiting"] for h in handles.values()]) == 1

        await await_for(waiting)
        version = next(VERSION)
        await pc.publish(version)
        answer = await late
        assert answer.model_extra["rl"]["version"] == version
        assert [(await _snap(h))["failures"] for h in handles.values()] == [0, 0]

    asyncio.run(main())


def test_router_at_its_cap_answers_503_then_serves_again(stack) -> None:
    ray, handles, _, _ = stack
    small, url = server(handles, max_sessions=2)

    async def main() -> None:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as http:
            body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
            for sid in ("cap-a", "cap-b"):
                assert (await http.post("/v1/chat/completions", json={**body, "session_id": sid})).status_code == 200
            full = await http.post("/v1/chat/completions", json={**body, "session_id": "cap-c"})
            assert full.status_code == 503 and full.headers["Retry-After"] == "1"
            assert "maximum" in full.json()["error"]["message"]
            await small.end_session.remote("cap-a")
            assert (await http.post("/v1/chat/completions", json={**body, "session_id": "cap-c"})).status_code == 200
            assert (await small.stats.remote())["status"]["503"] == 1

    try:
        asyncio.run(main())
    finally:  # its CPU back to the shared cluster, whatever failed (the placement tests wait for an idle one)
        ray.kill(small)


def test_over_long_context_is_400_before_any_lease(stack) -> None:
    ray, handles, srv, url = stack

    async def main() -> None:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as http:
            body = {"messages": [{"role": "user", "content": "x" * 60}], "session_id": "long"}
            r = await http.post("/v1/chat/completions", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
            assert "exceeds the model's 48 tokens" in r.json()["error"]["message"]
            r = await http.post(
                "/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "x"}], "max_tokens": 47}
            )
            assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        for h in handles.values():
            snap = await _snap(h)
            assert snap["active"] == 0 and snap["safe_failures"] == 0 and snap["failures"] == 0  # never reached it

    asyncio.run(main())


def test_client_disconnecting_mid_stream_settles_and_the_next_publication_drains(stack) -> None:
    ray, handles, srv, url = stack

    async def main() -> None:
        await asyncio.gather(*(h.throttle.remote(0.05) for h in handles.values()))
        try:
            body = {
                "messages": [{"role": "user", "content": "go"}],
                "max_tokens": 20,
                "stream": True,
                "session_id": "dc",
            }
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as http:
                async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                    assert r.status_code == 200
                    async for _ in r.aiter_bytes():
                        break  # the headers and the first line came: generation is under way; hang up

            async def settled() -> bool:
                record = await srv.trajectory.remote("dc")
                return bool(record.segments)

            await await_for(settled)
            record = await srv.trajectory.remote("dc")
            assert record.segments[0].finish_reason == "disconnected" and record.segments[0].completion_ids
            await publish(handles, next(VERSION))  # drains: nothing is left holding a lease
            for h in handles.values():
                snap = await _snap(h)
                assert snap["state"] == "open" and snap["failures"] == 0 and snap["active"] == 0
        finally:
            await asyncio.gather(*(h.throttle.remote(0.0) for h in handles.values()))

    asyncio.run(main())


def test_a_second_request_on_a_busy_session_is_409(stack) -> None:
    ray, handles, srv, url = stack

    async def main() -> None:
        await asyncio.gather(*(h.throttle.remote(0.05) for h in handles.values()))
        try:
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as http:
                body = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 10, "session_id": "busy"}
                first = asyncio.ensure_future(http.post("/v1/chat/completions", json=body))
                await await_for(lambda: _waiting_or_done(srv, first))
                second = await http.post("/v1/chat/completions", json=body)
                assert second.status_code == 409 and second.json()["error"]["param"] == "session_id"
                assert (await first).status_code == 200
        finally:
            await asyncio.gather(*(h.throttle.remote(0.0) for h in handles.values()))

    asyncio.run(main())


async def _waiting_or_done(srv, task) -> bool:
    return task.done() or (await srv.stats.remote())["waiting"] == 1
