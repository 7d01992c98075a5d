"""Session server failure semantics and input hardening on real Ray: an engine killed mid-session gives 410
for its sessions and nothing is replayed; a reply whose text re-encodes to other ids is recorded (and trained
on) with the ids generated; internal vs external sessions; hostile bodies answer 400/401/413, never 500."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from agents.chat import STOP, encode, render

from .scripted import saying
from .stack import CFG, KEY, engines, publish, server

pytestmark = pytest.mark.slow
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def killable(ray_driver):
    handles = engines(ray_driver, ["k0", "k1"])
    srv, url = server(handles, max_body_bytes=200_000)
    yield ray_driver, handles, srv, url
    for h in [srv, *handles.values()]:
        ray_driver.kill(h)


def _chat(sid: str | None, content: str = "hi", **extra) -> dict:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 3, **extra}
    return {**body, "session_id": sid} if sid else body


def test_hostile_bodies_are_refused_never_500(killable) -> None:
    _, _, srv, url = killable
    deep = "[" * 90_000 + "]" * 90_000  # within the body cap
    cases = [
        (deep, 400, None),
        ("{not json", 400, None),
        ("[1, 2]", 400, None),
        (json.dumps({**_chat(None), "n": 10**30}), 400, "n"),
        (json.dumps({**_chat(None), "n": 65}), 400, "n"),
        (json.dumps({**_chat(None), "max_tokens": 10**12}), 400, "max_tokens"),
        (json.dumps({**_chat(None), "max_tokens": -1}), 400, "max_tokens"),
        (json.dumps({**_chat(None), "temperature": 0.5}), 400, "temperature"),
        (json.dumps({**_chat(None), "stop": ["\n"]}), 400, "stop"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}] * 3000}), 400, "messages"),
        (json.dumps({"messages": [{"role": "user", "content": 123}]}), 400, "messages.0.content"),
        (json.dumps({"messages": [{"role": "user", "content": None}]}), 400, "messages.0.content"),
        (json.dumps({"messages": [{"role": "user", "content": [{"type": "text"}]}]}), 400, "messages.0.content"),
        (json.dumps({"messages": [{"role": "user", "content": {"a": [[[]]]}}]}), 400, "messages.0.content"),
        (json.dumps({"messages": [{"role": "root", "content": "x"}]}), 400, "messages.0.role"),
        (json.dumps({"messages": "hello"}), 400, "messages"),
        (json.dumps({"messages": []}), 400, "messages"),
        (json.dumps({"messages": [{"role": "user", "content": "caf\u00e9"}]}), 400, "messages.0.content"),
        (json.dumps({**_chat(None), "session_id": "bad id!"}), 400, "session_id"),
        (json.dumps({"prompt": ["a", "b"]}), 400, "prompt"),
        (json.dumps({**_chat(None), "logit_bias": {"abc": 5}}), 400, "logit_bias.abc"),
        (json.dumps({**_chat(None), "logit_bias": {"101": 5}}), 400, "logit_bias.101"),
        (json.dumps({**_chat(None), "logit_bias": {"-1": 5}}), 400, "logit_bias.-1"),
        (json.dumps({**_chat(None), "logit_bias": {"7": 101}}), 400, "logit_bias.7"),
        ('{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"7": NaN}}', 400, "logit_bias.7"),
        (json.dumps({**_chat(None), "logit_bias": {"7": "up"}}), 400, "logit_bias.7"),
        (json.dumps({**_chat(None), "logit_bias": {"7": True}}), 400, "logit_bias.7"),
        (json.dumps({**_chat(None), "logit_bias": [7]}), 400, "logit_bias"),
        (json.dumps({**_chat(None), "logit_bias": {str(i): 1 for i in range(400)}}), 400, "logit_bias"),
    ]

    async def main() -> None:
        async with httpx.AsyncClient(base_url=url, headers={**AUTH, "Content-Type": "application/json"}) as http:
            for raw, status, param in cases:
                path = "/v1/completions" if '"prompt"' in raw else "/v1/chat/completions"
                r = await http.post(path, content=raw)
                assert r.status_code == status, (raw[:80], r.text[:300])
                assert r.json()["error"]["param"] == param, (raw[:80], r.json())
            big = await http.post("/v1/chat/completions", content=json.dumps(_chat(None, "x" * 300_000)))
            assert big.status_code == 413 and big.json()["limit"] == 200_000 and "detail" in big.json()
            for headers in ({}, {"Authorization": "Bearer nope"}):
                r = await http.post("/v1/chat/completions", json=_chat(None), headers={"Authorization": ""} | headers)
                assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
            ok = await http.post("/v1/chat/completions", json={**_chat(None), "frequency_penalty": 1, "user": "u"})
            assert ok.status_code == 200  # unknown parameters are ignored
        stats = await srv.stats.remote()
        assert stats["status"]["400"] == len(cases) and stats["status"]["413"] == 1 and stats["status"]["401"] == 2
        assert stats["sessions"] == 0  # refused requests leave no session behind

    asyncio.run(main())


def test_internal_sessions_only_through_the_actor_and_history_must_extend(killable) -> None:
    _, _, srv, url = killable

    async def main() -> None:
        await srv.open_session.remote("int-1")
        async with httpx.AsyncClient(base_url=url, headers=AUTH) as http:
            a = await http.post("/v1/chat/completions", json=_chat("int-1"))
            b = await http.post("/v1/chat/completions", json=_chat("ext-1"))
            assert a.status_code == b.status_code == 200
            assert (await srv.trajectory.remote("int-1")).kind == "internal"
            assert (await srv.trajectory.remote("ext-1")).kind == "external"
            wrong = {"messages": [{"role": "user", "content": "other"}, {"role": "user", "content": "x"}]}
            r = await http.post("/v1/chat/completions", json={**wrong, "session_id": "int-1"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
            r = await http.post("/v1/completions", json={"prompt": "x", "session_id": "int-1"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "session_id"
            missing = await http.get("/v1/sessions/nope/trajectory")
            assert missing.status_code == 404
        for sid in ("int-1", "ext-1"):
            await srv.end_session.remote(sid)

    asyncio.run(main())


def test_recorded_ids_are_kept_when_the_text_re_encodes_differently(ray_driver) -> None:
    handles = engines(ray_driver, ["s0"])
    srv, url = server(handles)
    chars = [encode(c)[0] for c in "<|end|>"]
    first = render([{"role": "user", "content": "q"}])  # 4 tokens
    second = render([{"role": "user", "content": "r"}])

    async def main() -> None:
        await publish(handles, 1, saying(CFG, {len(first): chars + [STOP]}, default=encode("z")[0]))
        async with httpx.AsyncClient(base_url=url, headers=AUTH) as http:
            msgs = [{"role": "user", "content": "q"}]
            r = await http.post("/v1/chat/completions", json={"messages": msgs, "session_id": "re", "max_tokens": 9})
            content = r.json()["choices"][0]["message"]["content"]
            assert content == "<|end|>" and encode(content) == [STOP]  # the text re-encodes to one special id
            msgs += [{"role": "assistant", "content": content}, {"role": "user", "content": "r"}]
            r2 = await http.post("/v1/chat/completions", json={"messages": msgs, "session_id": "re", "max_tokens": 2})
            assert r2.status_code == 200
        record = await srv.trajectory.remote("re")
        assert record.segments[0].completion_ids == chars + [STOP]  # the generated ids, not encode(text)
        assert record.segments[1].prompt_ids == second  # the reply was not re-encoded or re-fed
        tokens, mask, logprobs, versions = record.training_arrays()
        assert tokens[: len(first) + 8] == first + chars + [STOP]
        assert mask[: len(first) + 8] == [0] * len(first) + [1] * 8
        assert versions[len(first) : len(first) + 8] == [1] * 8 and all(lp > -1e-3 for lp in logprobs[4:12])

    try:
        asyncio.run(main())
    finally:
        for h in [srv, *handles.values()]:
            ray_driver.kill(h)


def test_engine_killed_mid_session_is_410_and_never_replayed(killable) -> None:
    ray, handles, srv, url = killable
    sids = ("d-1", "d-2", "d-3")

    async def main() -> None:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30) as http:

            async def complete(sid: str, prompt: str, n: int = 3) -> httpx.Response:
                return await http.post("/v1/completions", json={"prompt": prompt, "max_tokens": n, "session_id": sid})

            texts = {sid: "hi" + (await complete(sid, "hi")).json()["choices"][0]["text"] for sid in sids}
            victim = (await srv.trajectory.remote("d-1")).engine
            on_victim = [s for s in sids if (await srv.trajectory.remote(s)).engine == victim]
            survivor = next(h for e, h in handles.items() if e != victim)
            before = (await survivor.snapshot.remote())["requests"]
            await handles[victim].throttle.remote(0.1)
            pending = asyncio.ensure_future(complete("d-1", texts["d-1"] + "more", 20))  # >= 2 s: no stop token
            await asyncio.sleep(0.5)
            ray.kill(handles[victim])
            r = await pending
            assert r.status_code == 410 and "d-1" in r.json()["error"]["message"]
            for sid in on_victim:  # every session of the dead engine is gone, and stays gone
                r = await complete(sid, texts[sid] + "x")
                assert r.status_code == 410 and sid in r.json()["error"]["message"]
            assert (await survivor.snapshot.remote())["requests"] == before  # nothing replayed there
            fresh = await complete("d-new", "hi")
            assert fresh.status_code == 200 and fresh.json()["rl"]["engine"] != victim
        record = await srv.trajectory.remote("d-1")
        assert record.state == "gone" and len(record.segments) == 1
        assert (await srv.stats.remote())["status"]["410"] == 1 + len(on_victim)

    asyncio.run(main())


def test_an_unknown_outcome_poisons_the_gate_until_a_reset(ray_driver) -> None:
    """A step that fails mid-generation is an unknown outcome: that request answers 502, the gate poisons and
    every later request answers 503 (never generated, never a 500) until the owner resets the gate; then the
    publication protocol reopens it and requests are served again."""
    handles = engines(ray_driver, ["p0"])
    srv, url = server(handles)
    engine = handles["p0"]
    try:
        ray_driver.get(engine.inject_step_failures.remote(1))
        failed = httpx.post(f"{url}/v1/chat/completions", json=_chat("u1"), headers=AUTH, timeout=60)
        assert failed.status_code == 502, failed.text
        assert ray_driver.get(engine.snapshot.remote())["state"] == "poisoned"
        refused = httpx.post(f"{url}/v1/chat/completions", json=_chat("u2"), headers=AUTH, timeout=60)
        assert refused.status_code == 503 and "poison" in refused.text, refused.text
        assert "Retry-After" in refused.headers
        assert "injected step failure" in ray_driver.get(engine.reset.remote("staff reset in a test"))
        asyncio.run(publish(handles, 1))  # drain, install, reopen: what trainer/controls.py does after a reset
        served = httpx.post(f"{url}/v1/chat/completions", json=_chat("u3"), headers=AUTH, timeout=60)
        assert served.status_code == 200, served.text
        assert ray_driver.get(srv.stats.remote())["status"]["503"] >= 1
    finally:
        for h in [srv, *handles.values()]:
            ray_driver.kill(h)
