"""Stop tokens on the real engine (one process, no Ray; weights scripted to say a known text): a one-row request
leaves when it samples a stop token, which it keeps; the cache holds exactly the returned tokens, so the next
turn continues after them; a multi-row request with stop is refused before generation; no stop is unchanged."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agents.chat import STOP, encode
from rollout.errors import RejectedBeforeGeneration
from trainer.config import TrainConfig
from trainer.engine import Engine

from .scripted import saying

torch.set_num_threads(1)
CFG = TrainConfig(
    environment="chat", context_tokens=48, d_model=64, n_head=4, n_layer=1, group_size=2, mode="local", device="cpu"
)
PROMPT = encode("ab")  # 2 tokens
REPLY = encode("hi") + [STOP]


def _engine() -> Engine:
    return Engine(CFG, "e0", max_sessions=4)


async def _install(engine: Engine, weights: dict) -> None:
    engine.seal()
    await engine.drain(5)
    await engine.install_version(1, weights)
    engine.reopen()


def test_a_sampled_stop_token_ends_the_request_and_is_kept() -> None:
    async def main() -> None:
        engine = _engine()
        # After the 2-token prompt: "hi<|end|>"; after the pending <|end|> and "c" (context 6): "xy<|end|>".
        await _install(engine, saying(CFG, {2: REPLY, 6: encode("xy") + [STOP]}, default=encode("z")[0]))
        out = await engine.generate("s", [PROMPT], 10, 0, "s/0", stop=[STOP])
        assert out["tokens"] == [REPLY] and out["finish_reasons"] == ["stop"]
        assert len(out["logprobs"][0]) == 3 and all(lp > -1e-3 for lp in out["logprobs"][0])
        assert engine.table.sessions["s"].length == 4  # prompt + "hi": the stop token is pending, not cached
        again = await engine.generate("s", [encode("c")], 10, 1, "s/1", continues=True, stop=[STOP])
        assert again["tokens"] == [encode("xy") + [STOP]] and again["finish_reasons"] == ["stop"]
        assert engine.table.sessions["s"].length == 8
        plain = await engine.generate(
            "t", [PROMPT], 5, 0, "t/0"
        )  # no stop: all 5 tokens (the 5th is the script at context 6), "length"
        assert plain["tokens"] == [REPLY + encode("zx")] and plain["finish_reasons"] == ["length"]
        short = await engine.generate("u", [PROMPT], 2, 0, "u/0", stop=[STOP])  # n reached first
        assert short["tokens"] == [encode("hi")] and short["finish_reasons"] == ["length"]
        assert engine.gate.snapshot()["failures"] == 0

    asyncio.run(main())


def test_stop_with_several_rows_is_refused_before_generation() -> None:
    async def main() -> None:
        engine = _engine()
        with pytest.raises(RejectedBeforeGeneration, match="one-row"):
            await engine.generate("g", [PROMPT, PROMPT], 4, 0, "g/0", stop=[STOP])
        snap = engine.gate.snapshot()
        assert snap["active"] == 0 and snap["state"] == "open" and snap["safe_failures"] == 1

    asyncio.run(main())


def test_stopping_request_leaves_a_shared_batch_without_changing_the_others() -> None:
    """Batch invariance: a row that stops early leaves; a request beside it gets the same tokens as alone."""

    async def both(together: bool) -> dict:
        engine = _engine()
        await _install(engine, saying(CFG, {2: REPLY}, default=encode("z")[0]))
        engine.throttle(0.001)  # steps on the thread, so both requests share steps
        if together:
            _, long = await asyncio.gather(
                engine.generate("a", [PROMPT], 10, 0, "a/0", stop=[STOP]),
                engine.generate("b", [encode("abc")], 6, 3, "b/0"),
            )
        else:
            long = await engine.generate("b", [encode("abc")], 6, 3, "b/0")
        return long

    alone, shared = asyncio.run(both(False)), asyncio.run(both(True))
    assert shared["tokens"] == alone["tokens"] and shared["logprobs"] == alone["logprobs"]
