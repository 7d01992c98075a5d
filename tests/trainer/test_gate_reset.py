"""The job side of a staff gate reset (trainer/controls.py): a gate poisoned mid-run (an unknown request
outcome, through the gate's own settle path) makes the run wait instead of failing; a `gate_reset` command
delivered through the event sink is applied after the engine versions are re-checked, answered with a
`control` event, and the run trains on. Without a reset the run fails when `poison_wait_s` runs out.

`mode: local` (engines in this process): the test reaches an engine's gate to poison it the way a lost request
does. The platform half (API, audit, delivery in ingest replies) is tests/api/test_gate_reset.py."""

from __future__ import annotations

import pytest

from rollout.gate import SettlementReceipt
from trainer.config import TrainConfig
from trainer.loop import TrainingRun
from trainer.sinks import EventEmitter

TINY = dict(
    task="digits",
    mode="local",
    steps=3,
    prompts_per_step=4,
    group_size=4,
    num_engines=2,
    num_workers=1,
    worker_capacity=4,
    eval_every=0,
    filter_zero_variance=False,
    min_valid_attempts=0,
    seed=3,
)


class StaffSink:
    """Captures events; once the job says it waits for a reset, a staff command is 'in the next reply'."""

    stop_requested = False

    def __init__(self, reset: bool) -> None:
        self.events: list[dict] = []
        self.reset = reset

    def write(self, event: dict) -> None:
        self.events.append(event)

    def close(self, timeout_s: float = 0) -> None:
        pass

    def of(self, type_: str) -> list[dict]:
        return [e["data"] for e in self.events if e["type"] == type_]

    def commands(self) -> list[dict]:
        waiting = any("waiting" in d.get("message", "") for d in self.of("log"))
        if not (self.reset and waiting):
            return []
        return [{"id": 7, "kind": "gate_reset", "reason": "request lost with its host", "requested_by": "root"}]


def poison_engine_0(run: TrainingRun, groups: list) -> None:
    if run.version != 1:
        return
    gate = run.rt.engines["engine-0"].gate

    async def lose_a_request() -> None:
        lease = await gate.acquire("s-lost", request_id="lost-1")
        gate.settle(lease, SettlementReceipt("lost-1", "s-lost", lease.version, False, False, "lost", "host gone"))

    run.rt.loop.run(lose_a_request())


def test_a_poisoned_gate_waits_for_a_staff_reset_then_the_run_trains_on() -> None:
    sink = StaffSink(reset=True)
    cfg = TrainConfig.from_dict({**TINY, "poison_wait_s": 60})
    result = TrainingRun(cfg, emitter=EventEmitter([sink]), on_step=poison_engine_0).run()

    assert result.status == "succeeded" and result.version == cfg.steps
    assert sink.of("control") == [
        {"id": 7, "kind": "gate_reset", "outcome": "applied", "detail": "every engine held v1; gates reset by root"}
    ]
    states = [d["state"] for d in sink.of("gate")]
    poisoned_at = states.index("poisoned")
    assert "open" in states[poisoned_at:]  # reopened after the reset
    assert [d["version"] for d in sink.of("version")] == [1, 2, 3]
    final_gate = sink.of("gate")[-1]
    assert final_gate["state"] == "open" and {e["version"] for e in final_gate["engines"]} == {cfg.steps}


def test_without_a_reset_the_run_fails_when_the_wait_runs_out() -> None:
    sink = StaffSink(reset=False)
    cfg = TrainConfig.from_dict({**TINY, "poison_wait_s": 1})
    with pytest.raises(Exception, match="poisoned"):
        TrainingRun(cfg, emitter=EventEmitter([sink]), on_step=poison_engine_0).run()
    assert sink.of("control") == []
    assert sink.of("gate")[-1]["state"] == "poisoned"
    assert any("waiting 1 s for a staff reset" in d["message"] for d in sink.of("log"))
