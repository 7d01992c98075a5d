"""Engine.generate_many, the coalesced turns of a rollout worker (one process, no Ray here; the worker's calls
over Ray run in tests/trainer/test_topology.py): each turn is its own request with its own lease and the same
numbers as alone, the batch runs as one, a refused turn fails alone, and a sealed gate admits them at reopen."""

from __future__ import annotations

import asyncio

from rollout.errors import RejectedBeforeGeneration
from rollout.types import TurnCall
from trainer.config import TrainConfig
from trainer.engine import Engine
from trainer.problems import task_build

CFG = TrainConfig(task="agent", group_size=4, mode="local", device="cpu", seed=3)
TASK = task_build(CFG)
PROMPTS = [TASK.prompt_tokens(p) for p in TASK.train_prompts[:6]]


def _turns(tag: str) -> list[TurnCall]:
    return [TurnCall(f"{tag}{i}", [p] * 4, 3, 100 + i, f"{tag}{i}/t0") for i, p in enumerate(PROMPTS)]


def test_coalesced_turns_are_one_batch_with_each_turns_own_lease_and_numbers() -> None:
    engine, alone = Engine(CFG, "a"), Engine(CFG, "b")

    async def main() -> tuple[list, list]:
        together = await engine.generate_many(_turns("s"))
        one_by_one = [await alone.generate(t.session_id, t.new_tokens, t.n, t.seed, t.request_id) for t in _turns("s")]
        return together, one_by_one

    together, one_by_one = asyncio.run(main())
    for got, want in zip(together, one_by_one):
        assert isinstance(got, dict)
        assert got["tokens"] == want["tokens"] and got["logprobs"] == want["logprobs"]  # exact floats
        assert got["request_id"] == want["request_id"] and got["version"] == 0
    assert engine.steps == 3  # all six requests advanced together, one token per step
    assert alone.steps == 6 * 3
    snap = engine.gate.snapshot()
    assert snap["active"] == 0 and snap["state"] == "open" and snap["failures"] == 0
    assert engine.requests == 6 and engine.calls == 1


def test_a_refused_turn_fails_alone_and_the_gate_stays_healthy() -> None:
    engine = Engine(CFG, "a")
    turns = _turns("r")
    too_long = TurnCall("long", [[1] * (engine.model.block_size + 5)] * 4, 3, 0, "long/t0")

    outcomes = asyncio.run(engine.generate_many([turns[0], too_long, turns[1]]))
    assert isinstance(outcomes[0], dict) and isinstance(outcomes[2], dict)
    assert isinstance(outcomes[1], RejectedBeforeGeneration)
    snap = engine.gate.snapshot()
    assert snap["state"] == "open" and snap["active"] == 0 and snap["safe_failures"] == 1


def test_turns_arriving_at_a_sealed_gate_are_admitted_at_reopen_under_the_new_version() -> None:
    engine = Engine(CFG, "a")

    async def main() -> list:
        engine.seal()
        call = asyncio.ensure_future(engine.generate_many(_turns("w")))
        await asyncio.sleep(0.05)
        assert engine.gate.snapshot()["waiting"] == len(PROMPTS)  # each turn waits with its own admission
        await engine.drain(1.0)
        await engine.install_version(1)
        assert engine.reopen() == len(PROMPTS)
        return await call

    outcomes = asyncio.run(main())
    assert [o["version"] for o in outcomes] == [1] * len(PROMPTS)


def test_a_cancelled_call_cancels_its_requests_and_poisons_the_gate() -> None:
    engine = Engine(CFG, "a")
    engine.throttle(0.05)  # slow steps: the requests are still running when the call is cancelled

    async def main() -> None:
        call = asyncio.ensure_future(engine.generate_many(_turns("c")))
        await asyncio.sleep(0.02)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        await asyncio.sleep(0.2)

    asyncio.run(main())
    snap = engine.gate.snapshot()
    assert snap["state"] == "poisoned" and snap["active"] == 0  # unknown outcomes fail closed, as a lone cancel
