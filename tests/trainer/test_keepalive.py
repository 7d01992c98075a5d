"""Keepalive on a real Ray cluster: an episode that waits at a sealed gate past its bound is aborted and re-run
(the run goes on), and quiesce before a checkpoint, with a deadline, loses and duplicates no group."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.checkpoint import checkpoint_load
from trainer.config import TrainConfig
from trainer.episodes import GroupTicket
from trainer.loop import TrainingRun
from trainer.problems import task_build
from trainer.sampler import GroupSampler
from trainer.sinks import EventEmitter
from trainer.topology import build_runtime

from .test_topology import TINY, Capture

pytestmark = pytest.mark.slow


def test_an_episode_waiting_past_its_bound_at_a_sealed_gate_is_aborted_then_the_next_one_runs(ray_driver) -> None:
    # The engine admits a waiting request for 4 x publish_deadline_s (0.4 s here), then refuses it.
    cfg = TrainConfig.from_dict({**TINY, "mode": "colocated", "publish_deadline_s": 0.1, "num_workers": 1})
    sampler = GroupSampler(len(task_build(cfg).train_prompts), cfg.seed)
    rt = build_runtime(cfg, sampler)
    try:
        worker = rt.workers[0]
        rt.loop.run(rt.publication.prepare(timeout_s=5))  # every gate sealed: the episode's first turn waits
        aborted = ray_driver.get(worker.generate_group.remote(GroupTicket(0, 0, 0)), timeout=60)
        assert aborted.aborted and aborted.payload is None
        assert aborted.meta["kind"] == "gate_wait"
        stats = ray_driver.get(worker.stats.remote())
        assert stats["aborted_by"] == {"gate_wait": 1}
        gate = rt.loop.run(rt.publication.snapshot())
        assert gate["state"] == "sealed"  # a refused admission is no unknown outcome: nothing poisoned

        rt.loop.run(rt.publication.resume())
        done = ray_driver.get(worker.generate_group.remote(GroupTicket(0, 0, 0)), timeout=60)
        assert not done.aborted and len(done.rewards) == cfg.group_size
        assert done.payload is None and done.meta["versions"] == [0]  # a receipt
    finally:
        rt.close()


def test_quiesce_with_a_deadline_loses_and_duplicates_nothing(ray_driver, tmp_path: Path) -> None:
    # max_staleness 1: a step's worth of groups is in flight when each checkpoint starts; the 10 ms deadline
    # ends most of them by abort (back to the sampler), the rest finish into the checkpoint's ready list.
    cfg = TrainConfig.from_dict(
        {
            **TINY,
            "mode": "colocated",
            "max_staleness": 1,
            "steps": 4,
            "checkpoint_every": 1,
            "quiesce_timeout_s": 0.01,
            "tool_latency_s": 0.05,
            "filter_zero_variance": False,
            "min_valid_attempts": 0,
        }
    )
    cap = Capture()
    run = TrainingRun(cfg, emitter=EventEmitter([cap]), checkpoint_dir=str(tmp_path))
    result = run.run()
    assert result.status == "succeeded"

    checkpoints = cap.of("checkpoint")
    assert [c["state"] for c in checkpoints] == ["saved"] * cfg.steps
    assert sum(c["rebuffered"] for c in checkpoints) > 0, "no group was in flight at a checkpoint"
    assert all(c["in_flight"] == c["finished"] + c["rebuffered"] for c in checkpoints)
    # The run page's serving panel reads these: aborts per reason, drain time per publication.
    if sum(c["rebuffered"] for c in checkpoints[:-1]):
        assert any(r.get("aborted_by", {}).get("quiesce") for r in cap.of("rollout"))
    assert all(v["drain_ms"] >= 0 for v in cap.of("version")) and len(cap.of("version")) == cfg.steps

    # Every group handed out is consumed once or back in the sampler (the scheduler returned the rest at close).
    consumed = [gid for gid, _ in result.consumed]
    assert len(consumed) == len(set(consumed)) == cfg.steps * cfg.prompts_per_step
    returned = [t.group_id for t in run.sampler.returned]
    assert sorted(consumed + returned) == list(range(run.sampler.group_count))

    # The latest checkpoint alone is as consistent: consumed + ready + returned = every id it handed out (the
    # groups waiting in the channel are saved as returned: a resumed run generates them again).
    _, state = checkpoint_load(tmp_path)
    ready = [entry[1]["group_id"] for entry in state["scheduler"]["ready"]]
    saved_returned = [t[0] for t in state["sampler"]["returned"]]
    saved_consumed = [gid for gid, _ in state["consumed"]]
    assert sorted(saved_consumed + ready + saved_returned) == list(range(state["sampler"]["group_count"]))
