"""The training job on a real Ray cluster: sync == async at max_staleness 0, the staleness invariant, a killed
engine restarted, the channel data path, and failed training steps letting go of their batch."""

from __future__ import annotations

import pytest
import torch

from trainer.config import TrainConfig
from trainer.learner_actor import InjectedFailure
from trainer.loop import TrainingRun
from trainer.problems import task_build
from trainer.sampler import GroupSampler
from trainer.sinks import EventEmitter
from trainer.topology import build_runtime

pytestmark = pytest.mark.slow

TINY = dict(
    task="agent",
    steps=3,
    prompts_per_step=6,
    group_size=4,
    num_engines=2,
    num_workers=2,
    worker_capacity=4,
    eval_every=0,
    tool_latency_s=0.01,
    seed=5,
)


class Capture:
    stop_requested = False

    def __init__(self) -> None:
        self.events: list[dict] = []

    def write(self, event: dict) -> None:
        self.events.append(event)

    def close(self, timeout_s: float = 0) -> None:
        pass

    def of(self, type_: str) -> list[dict]:
        return [e["data"] for e in self.events if e["type"] == type_]


def _run(cfg: TrainConfig, on_step=None) -> tuple:
    cap = Capture()
    final: dict = {}

    def hook(run: TrainingRun, groups: list) -> None:
        if on_step is not None:
            on_step(run, groups)
        if run.version == cfg.steps:
            final["weights"] = run.rt.trainer_call("weights")

    result = TrainingRun(cfg, emitter=EventEmitter([cap]), on_step=hook).run()
    return result, cap, final.get("weights")


def test_max_staleness_0_disaggregated_equals_the_synchronous_run(ray_driver) -> None:
    sync_cfg = TrainConfig.from_dict({**TINY, "mode": "colocated", "max_staleness": 0})
    sync, sync_events, sync_w = _run(sync_cfg)
    fast, fast_events, fast_w = _run(sync_cfg.replace(mode="disaggregated"))
    assert sync.status == fast.status == "succeeded"
    assert len(sync.consumed) == 3 * 6
    assert fast.consumed == sync.consumed  # same group ids and epochs, same order
    for name in sync_w:
        assert torch.equal(sync_w[name], fast_w[name]), (name, (sync_w[name] - fast_w[name]).abs().max())
    assert [d["reward_mean"] for d in fast_events.of("train")] == [d["reward_mean"] for d in sync_events.of("train")]
    assert all(d["staleness_max"] == 0 for d in fast_events.of("train"))


def test_every_consumed_token_is_within_max_staleness_and_tagged(ray_driver) -> None:
    cfg = TrainConfig.from_dict(
        {**TINY, "mode": "disaggregated", "max_staleness": 1, "steps": 5, "tool_latency_s": 0.03}
    )
    seen: list[int] = []

    def check(run: TrainingRun, groups: list) -> None:
        trainer_version = run.version - 1  # the version the batch was trained at
        for g in groups:
            for row in g.rows:
                request_ids = row.token_request_ids()
                turn_of = {pos: k for k, t in enumerate(row.turns) for pos in range(t.start, t.end)}
                for pos, (v, rid) in enumerate(zip(row.versions, request_ids)):
                    if not row.mask[pos]:
                        assert v == -1 and rid == "" and pos not in turn_of
                        continue
                    assert v >= trainer_version - cfg.max_staleness, (g.group_id, pos, v, trainer_version)
                    turn = turn_of[pos]
                    assert rid == row.turns[turn].request_id and rid.endswith(f"/t{turn}")
                    seen.append(trainer_version - v)
                turn_versions = [row.versions[t.start] for t in row.turns]
                assert turn_versions == sorted(turn_versions)  # later turns never run on older weights

    result, events, _ = _run(cfg, check)
    assert result.status == "succeeded"
    assert seen and max(seen) <= 1
    assert all(d["staleness_max"] <= 1 for d in events.of("train"))
    assert [d["version"] for d in events.of("version")] == [1, 2, 3, 4, 5]


def test_a_killed_engine_is_restarted_at_the_runs_version_and_serves_again(ray_driver) -> None:
    cfg = TrainConfig.from_dict(
        {**TINY, "mode": "disaggregated", "max_staleness": 1, "steps": 6, "tool_latency_s": 0.05, "worker_capacity": 6}
    )
    tombstones: list[int] = []
    killed: list = []

    def kill(run: TrainingRun, groups: list) -> None:
        if run.version == 2:
            killed.append(run.rt.engines["engine-1"])
            ray_driver.kill(killed[0])  # generation for the next batches is in flight
        if run.version >= 3:
            tombstones.append(sum(s["router"]["tombstones"] for s in run.rt.workers_call("stats")))

    result, events, _ = _run(cfg, kill)
    assert result.status == "succeeded" and result.version == cfg.steps
    lost = [d for d in events.of("worker") if d.get("event") == "engine_lost"]
    assert [d["engine"] for d in lost] == ["engine-1"] and lost[0]["engines"] == ["engine-0"]
    # Sessions bound to the dead engine were tombstoned (never re-routed to another engine).
    assert lost[0]["tombstoned_sessions"] >= 1 and max(tombstones) >= 1
    assert sum(d["aborted"] for d in events.of("rollout")) >= 1  # their groups were re-run elsewhere
    # The driver started a new engine-1 at the run's version and routes to it again.
    (restarted,) = [d for d in events.of("worker") if d.get("event") == "engine_restarted"]
    assert restarted["engine"] == "engine-1" and restarted["engines"] == ["engine-0", "engine-1"]
    assert restarted["version"] in (2, 3) and restarted["restarts"] == 1
    at = events.events.index(next(e for e in events.events if e["data"].get("event") == "engine_restarted"))
    later = [e["data"] for e in events.events[at:] if e["type"] == "rollout"][1:]  # generated after the restart
    assert any("engine-1" in d["engines"] for d in later), later  # the new engine served groups that trained
    gate = events.of("gate")[-1]
    assert gate["state"] == "open" and sorted(e["engine"] for e in gate["engines"]) == ["engine-0", "engine-1"]
    assert {e["version"] for e in gate["engines"]} == {cfg.steps}  # the new engine took every publication since


def _driver_refs(ray) -> int:
    return len(ray._private.worker.global_worker.core_worker.get_all_reference_counts())


def one_batch(rt, version: int) -> list:
    """What the loop's collect_batch does: generate, the learner takes, the ledger claims (none stale here)."""
    rt.scheduler.generate(version)
    taken = rt.take_batch()
    assert rt.scheduler.claim([(g.group_id, g.meta["attempt"], False) for g in taken]) == ["train"] * len(taken)
    return taken


def test_workers_put_groups_into_the_channel_and_a_failed_step_lets_go_of_its_batch(ray_driver) -> None:
    cfg = TrainConfig.from_dict({**TINY, "mode": "colocated", "task": "digits", "prompts_per_step": 8})
    sampler = GroupSampler(len(task_build(cfg).train_prompts), cfg.seed)
    rt = build_runtime(cfg, sampler)
    try:
        rt.trainer_call("inject_failures", 3)
        refs = []
        for _ in range(3):
            groups = one_batch(rt, 0)
            # Workers put only kept groups, keyed by the task; the learner took a batch of them by tokens.
            assert len(groups) == cfg.prompts_per_step and all(g.meta["attempt"] for g in groups)
            with pytest.raises(InjectedFailure):
                try:
                    rt.train_taken(groups)
                except ray_driver.exceptions.RayTaskError as exc:
                    raise exc.as_instanceof_cause() from exc
            with pytest.raises(ray_driver.exceptions.RayTaskError, match="KeyError"):
                rt.train_taken(groups)  # the failed step let go of its batch: nothing is held for a retry
            refs.append(_driver_refs(ray_driver))
        assert refs[-1] <= refs[0], refs  # nothing accumulates across failures
        metrics = rt.channel.metrics()
        assert metrics["digits/queued"] == 0 and metrics["digits/groups_in"] >= 3 * cfg.prompts_per_step
        assert rt.train_taken(one_batch(rt, 0))["version"] == 1  # and the next step trains normally
    finally:
        rt.close()


def test_colocated_keeps_live_episodes_alive_across_the_training_window(ray_driver) -> None:
    # 6 training windows: an episode spans one only if it is between turns at a seal and its group is trained (not
    # filtered); with 4, one run of the full suite (the machine busy beside it) had none.
    cfg = TrainConfig.from_dict({**TINY, "mode": "colocated", "max_staleness": 1, "steps": 6, "tool_latency_s": 0.03})
    spanning: list[list[int]] = []

    def check(run: TrainingRun, groups: list) -> None:
        for g in groups:
            assert min(g.versions) >= run.version - 1 - cfg.max_staleness
            if len(set(g.versions)) > 1:
                spanning.append(g.versions)  # started before a publication, finished after it

    result, events, _ = _run(cfg, check)
    assert result.status == "succeeded"
    assert spanning, "no episode survived a training window"
    # Generation was paused while training: the gate was sealed from the batch until the new version.
    states = [d["state"] for d in events.of("gate")]
    assert states[1:] == ["sealed", "open"] * cfg.steps
