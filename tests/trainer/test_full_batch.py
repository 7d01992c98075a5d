"""Full batches on a real Ray cluster: at max_staleness 1, with a slow learner and an engine slow enough that its
episodes outlast two publications, the ledger drops stale groups and every dropped group is replaced, so every
trained step has exactly prompts_per_step groups; no group id is lost or trained twice, in the run, in its
checkpoint and across a resume from it; and every log-prob mismatch the train events report is within 1e-5."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.checkpoint import checkpoint_load
from trainer.config import TrainConfig
from trainer.loop import TrainingRun
from trainer.sinks import EventEmitter

from .test_topology import TINY, Capture

pytestmark = pytest.mark.slow

CFG = TrainConfig.from_dict(
    {
        **TINY,
        "mode": "disaggregated",
        "max_staleness": 1,
        "steps": 10,
        "prompts_per_step": 4,
        "tool_latency_s": 0.05,
        "checkpoint_every": 0,  # the final checkpoint only: a quiesce lets the slow episodes finish, not go stale
        "filter_zero_variance": False,
        "min_valid_attempts": 0,
    }
)
LEARNER_DELAY_S = 0.3  # every training step this much longer: a slow learner
ENGINE_DELAY_S = 1.0  # every forward step of engine-1: its episodes outlast two publications and come back stale


def _slow_down(ray):
    def hook(run: TrainingRun, groups: list) -> None:
        if not getattr(run, "slowed", False):  # after the first step of each run (a resumed one has new actors)
            run.slowed = True  # type: ignore[attr-defined]
            run.rt.trainer_call("throttle", LEARNER_DELAY_S)
            ray.get(run.rt.engines["engine-1"].throttle.remote(ENGINE_DELAY_S))

    return hook


def _check_full(cap: Capture, cfg: TrainConfig) -> int:
    """Every step trained exactly prompts_per_step groups; returns how many taken groups the ledger dropped."""
    trains, rollouts = cap.of("train"), cap.of("rollout")
    assert len(trains) == len(rollouts) and trains
    for train, rollout in zip(trains, rollouts):
        channel = rollout["channel"]
        assert train["groups"] == len(train["group_ids"]) == rollout["groups"] == cfg.prompts_per_step, rollout
        drops = rollout["stale"] + channel["orphans"]
        assert channel["refilled"] == drops and channel["taken"] == cfg.prompts_per_step + drops, rollout
        if "logprob_diff_max" in train:
            assert 0 <= train["logprob_diff_mean"] <= train["logprob_diff_max"] <= 1e-5, train
    assert "logprob_diff_max" in trains[0]  # the first batch was sampled with version 0 only: comparable
    return sum(r["stale"] + r["channel"]["orphans"] for r in rollouts)


def _ids_once(run: TrainingRun, consumed: list[int]) -> None:
    """Every id the sampler handed out was trained once or is back in the sampler (the scheduler returns what
    was dispatched and not trained when the run closes)."""
    returned = [t.group_id for t in run.sampler.returned]
    assert len(consumed) == len(set(consumed))
    assert sorted(consumed + returned) == list(range(run.sampler.group_count))


def test_dropped_stale_groups_are_replaced_and_every_batch_is_full(ray_driver, tmp_path: Path) -> None:
    cap = Capture()
    run = TrainingRun(CFG, emitter=EventEmitter([cap]), checkpoint_dir=str(tmp_path), on_step=_slow_down(ray_driver))
    result = run.run()
    assert result.status == "succeeded" and result.version == CFG.steps
    dropped = _check_full(cap, CFG)
    consumed = [gid for gid, _ in result.consumed]
    assert len(consumed) == CFG.steps * CFG.prompts_per_step
    _ids_once(run, consumed)

    # The checkpoint at the last step is as consistent: consumed + waiting in the channel + returned = every id.
    _, state = checkpoint_load(tmp_path)
    ready = [entry[1]["group_id"] for entry in state["scheduler"]["ready"]]
    saved_returned = [t[0] for t in state["sampler"]["returned"]]
    saved_consumed = [gid for gid, _ in state["consumed"]]
    assert saved_consumed == consumed
    assert sorted(saved_consumed + ready + saved_returned) == list(range(state["sampler"]["group_count"]))

    # Resumed from it for two more steps: full batches again, and still no id lost or trained twice.
    more = CFG.replace(steps=CFG.steps + 2)
    cap2 = Capture()
    resumed = TrainingRun(
        more, emitter=EventEmitter([cap2]), checkpoint_dir=str(tmp_path), resume=True, on_step=_slow_down(ray_driver)
    )
    result2 = resumed.run()
    assert result2.status == "succeeded" and result2.version == more.steps
    dropped += _check_full(cap2, more)
    consumed2 = [gid for gid, _ in result2.consumed]
    assert consumed2[: len(consumed)] == consumed and len(consumed2) == more.steps * more.prompts_per_step
    _ids_once(resumed, consumed2)
    print(f"full batches: {dropped} dropped groups replaced over {more.steps} steps")
    assert dropped > 0, "no stale or orphan group was dropped: the top-up was not exercised"
