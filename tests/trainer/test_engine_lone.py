"""A lone request on the batching engine (one process, no Ray): its cheap steps run on the event loop, with
the same numbers as on the step thread, failing closed like a thread step, and reading the installed weights."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rollout.errors import SessionGoneError
from trainer.config import TrainConfig
from trainer.engine import Engine
from trainer.policy import sample_tokens
from trainer.problems import task_build

CFG = TrainConfig(task="agent", group_size=4, mode="local", device="cpu", seed=3)
PROMPT = task_build(CFG).prompt_tokens(task_build(CFG).train_prompts[0])


class ThreadHops:
    """Counts the steps handed to the engine's step thread (a spy on its executor)."""

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        submit = engine._executor.submit

        def counted(*args, **kwargs):
            self.count += 1
            return submit(*args, **kwargs)

        engine._executor.submit = counted  # type: ignore[method-assign]


def _two_turns(engine: Engine, sid: str, seed: int) -> list[dict]:
    async def main() -> list[dict]:
        first = await engine.generate(sid, [PROMPT] * 4, 3, seed, f"{sid}/t0")
        second = await engine.generate(sid, [[5, 9]] * 4, 2, seed + 1, f"{sid}/t1", False, True, True)
        return [first, second]

    return asyncio.run(main())


@pytest.fixture
def roomy_budget(monkeypatch) -> None:
    """Every lone step fits the inline budget once its cost is known (the real 2 ms depends on the load)."""
    monkeypatch.setattr("trainer.engine_runner.INLINE_STEP_S", 10.0)


def test_a_lone_cheap_request_is_answered_on_the_loop_with_the_threads_numbers(roomy_budget) -> None:
    inline, threaded = Engine(CFG, "a"), Engine(CFG, "b")
    hops = ThreadHops(inline)
    _two_turns(inline, "warm", 7)  # the first lone step runs on the thread: its cost is unknown until then
    assert hops.count == 1
    got = _two_turns(inline, "s", 11)
    assert hops.count == 1  # both turns ran on the loop, no hop
    threaded.throttle(0.001)  # a throttled engine never steps on the loop
    want = _two_turns(threaded, "s", 11)
    for a, b in zip(got, want):
        assert a["tokens"] == b["tokens"] and a["logprobs"] == b["logprobs"]  # exact floats
    assert inline.snapshot()["kv_rows_used"] == 0 and inline.snapshot()["state"] == "open"


def test_a_lone_step_too_costly_for_the_loop_goes_to_the_thread(monkeypatch) -> None:
    engine = Engine(CFG, "e")
    hops = ThreadHops(engine)
    monkeypatch.setattr("trainer.engine_runner.INLINE_STEP_S", 0.0)  # every step predicted over the budget
    _two_turns(engine, "a", 1)
    _two_turns(engine, "b", 2)
    assert hops.count == 4  # every turn, each in one hop (the thread runs its steps back to back)
    assert engine.steps == 10


def test_a_failed_inline_step_fails_its_request_and_poisons_the_gate(roomy_budget, monkeypatch) -> None:
    engine = Engine(CFG, "e")
    _two_turns(engine, "warm", 1)
    hops = ThreadHops(engine)

    def broken(*args, **kwargs):
        raise MemoryError("out of KV memory")

    monkeypatch.setattr("trainer.engine_step.run_step", broken)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="step failed"):
            await engine.generate("s", [PROMPT] * 4, 2, 0, "s/t0")

    asyncio.run(main())
    assert hops.count == 0  # it did fail on the loop
    snap = engine.snapshot()
    assert snap["state"] == "poisoned" and snap["inflight"] == 0 and snap["kv_rows_used"] == 0
    with pytest.raises(SessionGoneError, match="step failed"):
        engine.table.check("s", continues=True, group=4)


def test_the_step_reads_the_weights_an_install_copies_in() -> None:
    """The step reads the parameters through views made once (kvpool.StepWeights): after an install they must
    be the new weights, the ones the plain model forward uses."""
    engine = Engine(CFG, "e")
    _two_turns(engine, "warm", 1)
    torch.manual_seed(5)
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in engine.model.state_dict().items()}

    async def install() -> None:
        engine.seal()
        await engine.drain(5.0)
        await engine.install_version(1, new)
        engine.reopen()

    asyncio.run(install())
    got = asyncio.run(engine.generate("s", [PROMPT] * 4, 3, 0, "s/t0", True))
    want, logps, *_ = sample_tokens(
        engine.model, torch.tensor([PROMPT] * 4), None, 3, temperature=1.0, generator=None, greedy=True
    )
    assert got["version"] == 1 and got["tokens"] == want.tolist()
    assert torch.allclose(torch.tensor(got["logprobs"]), logps, atol=1e-5)
