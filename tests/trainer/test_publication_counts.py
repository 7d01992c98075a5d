"""A publication's work on a real run (Ray, two engines, disaggregated): every `version` event says how many leases
its drains waited for and how many requests waited at the closed gates, per engine and summed; with the workers
a step ahead and the engines slowed, generation is in flight when the trainer publishes: some drain waited."""

from __future__ import annotations

import pytest

from trainer.config import TrainConfig
from trainer.loop import TrainingRun
from trainer.sinks import EventEmitter

from .test_topology import TINY, Capture

pytestmark = pytest.mark.slow

# max_staleness 1: the workers generate the next batch while the trainer trains and publishes.
CFG = TrainConfig.from_dict({**TINY, "mode": "disaggregated", "max_staleness": 1, "steps": 4, "prompts_per_step": 4})
ENGINE_DELAY_S = 0.05  # every forward step this much longer: generating a batch outlasts training one


def _slow_engines(ray):
    def hook(run: TrainingRun, groups: list) -> None:
        if not getattr(run, "slowed", False):
            run.slowed = True  # type: ignore[attr-defined]
            ray.get([engine.throttle.remote(ENGINE_DELAY_S) for engine in run.rt.engines.values()])

    return hook


def test_every_version_event_counts_its_drain_and_reopen_and_some_drain_waited(ray_driver) -> None:
    cap = Capture()
    run = TrainingRun(CFG, emitter=EventEmitter([cap]), on_step=_slow_engines(ray_driver))
    result = run.run()
    assert result.status == "succeeded"
    versions = cap.of("version")
    assert [v["version"] for v in versions] == list(range(1, CFG.steps + 1))
    for v in versions:
        engines = v["engines"]
        assert [e["engine"] for e in engines] == ["engine-0", "engine-1"]
        assert v["drained"] == sum(e["drained"] for e in engines) >= 0
        assert v["admitted_at_reopen"] == sum(e["admitted_at_reopen"] for e in engines) >= 0
    counts = [(v["drained"], v["admitted_at_reopen"]) for v in versions]
    print(f"per publication (drained, admitted_at_reopen): {counts}")
    assert any(v["drained"] > 0 for v in versions), counts  # leases were in flight at some publication

    # The engines' batching, as the run page shows it (rows / step): cumulative counters in every gate event, never
    # going back, each forward step advancing at least one row.
    by_engine: dict[str, list[tuple[int, int]]] = {}
    for gate in cap.of("gate"):
        for e in gate["engines"]:
            by_engine.setdefault(e["engine"], []).append((e["steps"], e["rows_stepped"]))
    assert sorted(by_engine) == ["engine-0", "engine-1"]
    for name, seen in by_engine.items():
        assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(seen, seen[1:])), (name, seen)
        assert all(rows >= steps for steps, rows in seen), (name, seen)
    assert any(seen[-1][0] > 0 for seen in by_engine.values()), by_engine  # the engines stepped
