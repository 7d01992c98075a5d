"""`n` choices on the session server, on real Ray with the official openai client: one request answers n
choices from one engine request of n rows; each choice is cut after its own stop token; the session records one
segment per choice (same request and prompt) and training splits them into n episodes; the session takes no
further request; n out of range, n with stream, and n on a session's later turn are 400 naming the field."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from agents.chat import STOP, VOCAB_SIZE, encode, render
from agents.envs.digits import DIGIT_BIAS
from trainer.episodes import GroupTicket
from trainer.trajectories import TrajectoryRecord, group_from_trajectories, split_choices

from .scripted import saying
from .stack import CFG, KEY, engines, publish, server

pytestmark = pytest.mark.slow
AUTH = {"Authorization": f"Bearer {KEY}"}
MSGS = [{"role": "user", "content": "ab"}]
PROMPT = render(MSGS)  # 5 ids


@pytest.fixture(scope="module")
def stack(ray_driver):
    handles = engines(ray_driver, ["c0"])
    srv, url = server(handles)
    yield handles, srv, url
    for h in [srv, *handles.values()]:
        ray_driver.kill(h)


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)


def test_a_session_answered_with_n_choices_frees_its_rows_with_the_answer(stack) -> None:
    """It takes no further request, so the engine frees its rows at once (the request is the session's last) and
    ending it calls no engine; a one-choice session keeps its rows until it is ended."""
    handles, srv, url = stack

    async def main() -> None:
        before = (await handles["c0"].snapshot.remote())["sessions"]
        await srv.open_sessions.remote(["free-n", "free-1"])
        client = _client(url)
        for sid, n in (("free-n", 4), ("free-1", 1)):
            await client.chat.completions.create(
                model="x", messages=MSGS, max_tokens=3, n=n, logit_bias=DIGIT_BIAS, extra_body={"session_id": sid}
            )
        assert (await handles["c0"].snapshot.remote())["sessions"] == before + 1  # only free-1 holds rows
        records = await srv.end_sessions.remote(["free-n", "free-1"])
        assert [len(r.segments) for r in records] == [4, 1]
        assert (await handles["c0"].snapshot.remote())["sessions"] == before
        await client.close()

    asyncio.run(main())


def test_n_choices_are_one_request_recorded_per_choice_and_split_into_episodes(stack) -> None:
    handles, srv, url = stack

    async def main() -> None:
        await srv.open_sessions.remote(["grp-1"])
        engine_calls = (await handles["c0"].snapshot.remote())["requests"]
        client = _client(url)
        reply = await client.chat.completions.create(
            model="x", messages=MSGS, max_tokens=3, n=4, logit_bias=DIGIT_BIAS, extra_body={"session_id": "grp-1"}
        )
        assert (await handles["c0"].snapshot.remote())["requests"] == engine_calls + 1  # one engine request
        assert [c.index for c in reply.choices] == [0, 1, 2, 3]
        texts = [c.message.content for c in reply.choices]
        assert all(len(t) == 3 and t.isdigit() for t in texts) and len(set(texts)) > 1
        assert reply.usage.completion_tokens == 12 and reply.usage.prompt_tokens == len(PROMPT)
        later = [*MSGS, {"role": "assistant", "content": texts[0]}, {"role": "user", "content": "c"}]
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="x", messages=later, extra_body={"session_id": "grp-1"})
        assert refused.value.body["param"] == "session_id"
        [record] = await srv.end_sessions.remote(["grp-1"])
        segments = record.segments
        assert [s.choice for s in segments] == [0, 1, 2, 3] and len({s.request_id for s in segments}) == 1
        assert all(
            s.prompt_ids == PROMPT and s.logit_bias == sorted((int(k), 100.0) for k in DIGIT_BIAS) for s in segments
        )
        assert [s.completion_ids for s in segments] == [encode(t) for t in texts]
        episodes = split_choices(TrajectoryRecord.from_plain(record.model_dump(mode="json")))
        assert [e.session_id for e in episodes] == [f"grp-1#{k}" for k in range(4)]
        group = group_from_trajectories(
            GroupTicket(0, 0, 0), episodes, [0.0, 1.0, 0.0, 1.0], max_tokens=48, vocab_size=VOCAB_SIZE
        )
        assert [r.tokens for r in group.rows] == [PROMPT + encode(t) for t in texts]
        assert all(r.mask == [0] * len(PROMPT) + [1] * 3 for r in group.rows)
        with pytest.raises(ValueError, match="split_choices"):
            group_from_trajectories(
                GroupTicket(0, 0, 0),
                [TrajectoryRecord.from_plain(record.model_dump())],
                [0.0],
                max_tokens=48,
                vocab_size=VOCAB_SIZE,
            )

    asyncio.run(main())


def test_each_choice_is_cut_after_its_own_stop_token(stack) -> None:
    handles, srv, url = stack

    async def main() -> None:
        await publish(handles, 1, saying(CFG, {len(PROMPT): encode("hi") + [STOP]}, default=encode("z")[0]))
        reply = await _client(url).chat.completions.create(model="x", messages=MSGS, max_tokens=6, n=3)
        assert [(c.message.content, c.finish_reason) for c in reply.choices] == [("hi", "stop")] * 3
        assert [c.model_extra["rl"]["token_ids"] for c in reply.choices] == [encode("hi") + [STOP]] * 3
        assert reply.usage.completion_tokens == 9
        snap = await handles["c0"].snapshot.remote()
        assert snap["failures"] == 0 and snap["state"] == "open" and snap["active"] == 0

    asyncio.run(main())


def test_bad_n_is_a_400_naming_n(stack) -> None:
    _, srv, url = stack

    async def main() -> None:
        async with httpx.AsyncClient(base_url=url, headers=AUTH) as http:
            for extra in ({"n": 65}, {"n": 0}, {"n": -3}, {"n": 2, "stream": True}):
                r = await http.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 2, **extra})
                assert r.status_code == 400 and r.json()["error"]["param"] == "n", (extra, r.text)
            body = {"messages": MSGS, "max_tokens": 2, "session_id": "turns-1"}
            first = await http.post("/v1/chat/completions", json=body)
            assert first.status_code == 200
            history = [*MSGS, {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]}]
            second = {**body, "messages": [*history, {"role": "user", "content": "c"}], "n": 2}
            r = await http.post("/v1/chat/completions", json=second)
            assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
            del second["n"]
            assert (await http.post("/v1/chat/completions", json=second)).status_code == 200  # nothing was lost
        stats = await srv.stats.remote()
        assert stats["status"]["400"] >= 5

    asyncio.run(main())


def test_a_seeded_group_draws_the_same_choices_again_whichever_session_asks(stack) -> None:
    """The digits environment's group request with the worker's group seed (trainer/agent_episodes.py): the same
    seed on another session gives the same n choices, token for token; another seed gives others. So a group
    rerun after an abort, or a whole run from its seed, samples what it sampled before, as in process."""
    handles, srv, url = stack
    from agents.envs.digits import DigitsEnvironment
    from trainer.agent_episodes import ServerSessions

    env = DigitsEnvironment(seed=0)
    task = env.tasks("train")[5]

    async def main() -> list[list[list[int]]]:
        client, pool = _client(url), ServerSessions(srv, "seeded")
        sids = await pool.take(3)
        for sid, seed in zip(sids, (11, 11, 12)):
            await env.run_group(client, sid, task, 8, seed=seed)
        records = await pool.end(sids)
        await client.close()
        return [[s.completion_ids for s in r.segments] for r in records]

    first, again, other = asyncio.run(main())
    assert first == again and len(first) == 8
    assert other != first
