"""The job's gang reservation on a real Ray cluster: one placement group per run whose bundles are exactly what Ray
charges, every actor in its own bundle with its bundle's threads, the `resources` events (waiting, ready with a
node per process, timeout), a run that cannot be placed exiting 0 without training, and heartbeats meanwhile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.trainer.test_sinks import Ingest
from tests.trainer.test_topology import Capture
from tests.wait import wait_until
from trainer.config import TrainConfig
from trainer.loop import TrainingRun
from trainer.placement import PlacementTimeout
from trainer.problems import task_build
from trainer.resources import actor_bundles, bundle_index, run_bundles
from trainer.sampler import GroupSampler
from trainer.sinks import EventEmitter
from trainer.topology import build_runtime

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
TINY = dict(
    task="digits",
    mode="colocated",
    steps=2,
    prompts_per_step=4,
    group_size=4,
    num_engines=2,
    num_workers=2,
    worker_capacity=4,
    eval_every=0,
    seed=3,
    actor_memory_mb=128,
    learner_cpus=2.0,  # two whole CPUs: the learner computes with two threads
)


def _free(ray) -> tuple[float, float]:
    """Free CPU and memory (MiB) of the cluster, as Ray accounts them."""
    free = ray.available_resources()
    return round(free.get("CPU", 0.0), 4), round(free.get("memory", 0.0) / MIB, 3)


def _idle(ray, timeout: float = 60) -> tuple[float, float]:
    """The free resources once the cluster is idle; failing, names the live actors that still hold CPUs (one
    test's leftovers fail the next one here: say whose they are)."""
    deadline = time.monotonic() + timeout
    while _free(ray)[0] != 4.0:
        if time.monotonic() > deadline:
            from ray.util.state import list_actors

            alive = sorted(a.class_name for a in list_actors(filters=[("state", "=", "ALIVE")], limit=200))
            pytest.fail(
                f"timed out after {timeout} s waiting for an idle cluster: {_free(ray)} free; alive: {alive}",
                pytrace=False,
            )
        time.sleep(0.05)
    return _free(ray)


def _inside(handle, ray):
    """What the actor itself sees: its placement group, its assigned resources, torch and OpenMP threads."""

    def probe(self):  # noqa: ANN001, ANN202 - runs inside the actor
        import os

        import ray
        import torch

        ctx = ray.get_runtime_context()
        return ctx.get_placement_group_id(), ctx.get_assigned_resources(), torch.get_num_threads(), os.environ

    pg, assigned, threads, env = ray.get(handle.__ray_call__.remote(probe), timeout=60)
    return pg, assigned, threads, {k: env.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def test_actors_run_in_their_bundles_and_ray_charges_exactly_the_run(ray_driver) -> None:
    ray = ray_driver
    cfg = TrainConfig.from_dict(TINY)
    bundles = actor_bundles(cfg)
    want_cpu = round(sum(b.cpus for b in bundles), 4)
    assert want_cpu == round(2.0 + 0.05 + 2 * 0.4 + 2 * 0.35, 4)
    before = _idle(ray)
    seen: dict = {}

    def check(run: TrainingRun, groups: list) -> None:
        if run.version != 1:
            return
        rt = run.rt
        pg = rt.placement.group.id.hex()
        want = (round(before[0] - want_cpu, 4), round(before[1] - len(bundles) * 128, 3))
        seen["free"] = wait_until(lambda: _free(ray) == want and _free(ray), timeout=30, what=f"free == {want}")
        handles = {**rt.engines, "learner": rt.trainer, "channel": rt.channel._actor}
        handles.update({f"worker-{i}": w for i, w in enumerate(rt.workers)})
        for role, handle in handles.items():
            group, assigned, threads, env = _inside(handle, ray)
            bundle = bundles[bundle_index(cfg, role)]
            assert group == pg, role
            assert assigned == {"CPU": bundle.cpus, "memory": float(bundle.memory)}, role  # its bundle, exactly
            if role != "channel":  # the channel never imports torch's compute; its env still follows the bundle
                assert threads == bundle.threads, role
            assert env == {"OMP_NUM_THREADS": str(bundle.threads), "MKL_NUM_THREADS": str(bundle.threads)}, role
        seen["threads"] = {r: _inside(h, ray)[2] for r, h in handles.items() if r != "channel"}
        seen["pg"] = rt.placement.group

    cap = Capture()
    result = TrainingRun(cfg, emitter=EventEmitter([cap]), on_step=check).run()
    assert result.status == "succeeded"
    assert seen["threads"]["learner"] == 2 and seen["threads"]["engine-0"] == 1
    resources = cap.of("resources")
    assert [d["state"] for d in resources] == ["waiting", "placed", "ready"]
    node = ray.get_runtime_context().get_node_id()
    placed, ready = resources[1], resources[2]
    assert ready["nodes"] == [node] * len(run_bundles(cfg))  # driver, then every bundle
    assert ready["strategy"] == "PACK" and ready["waited_s"] >= 0
    # `placed` as soon as the group is ready, with the same nodes, before any process starts in it.
    assert placed["nodes"] == ready["nodes"] and placed["waited_s"] == ready["waited_s"]
    assert placed["detail"].endswith(f"starting {len(run_bundles(cfg)) - 1} process(es)"), placed["detail"]
    # `ready` before the run says it is running; the group is gone once the run ended.
    assert [e["type"] for e in cap.events][:4] == ["resources", "resources", "resources", "status"]
    assert ray.util.placement_group_table(seen["pg"])["state"] == "REMOVED"
    wait_until(lambda: _free(ray) == before, timeout=30, what="every reserved resource back")


def test_a_group_that_cannot_be_placed_times_out_and_is_removed(ray_driver) -> None:
    ray = ray_driver
    cfg = TrainConfig.from_dict({**TINY, "learner_cpus": 64.0, "placement_timeout_s": 1.0})
    cap = Capture()
    emitter = EventEmitter([cap])
    sampler = GroupSampler(len(task_build(cfg).train_prompts), cfg.seed)
    groups_before = set(ray.util.placement_group_table())
    t0 = time.monotonic()
    with pytest.raises(PlacementTimeout, match="not ready within 1 s"):
        build_runtime(cfg, sampler, emit=emitter.emit)
    assert time.monotonic() - t0 < 30
    assert [d["state"] for d in cap.of("resources")] == ["waiting", "timeout"]
    assert cap.of("resources")[1]["waited_s"] >= 1.0 and "CPU 65.55" in cap.of("resources")[1]["detail"]
    new = {k: v for k, v in ray.util.placement_group_table().items() if k not in groups_before}
    assert len(new) == 1 and next(iter(new.values()))["state"] == "REMOVED"  # removed while this driver lives


def test_the_job_waits_heartbeating_then_exits_0_without_training(ray_cluster, tmp_path: Path) -> None:
    """The CLI against a stand-in ingest server: heartbeats from the start, `waiting`, `timeout`, exit 0."""
    server = Ingest([])
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**TINY, "learner_cpus": 64.0, "placement_timeout_s": 8.0}))
    env = {
        **os.environ,
        "RAY_ADDRESS": ray_cluster.address,
        "RUN_INGEST_TOKEN": "tok",
        "PYTHONPATH": str(ROOT),
    }
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "trainer", "run", "--config", str(config), "--events", server.url],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["status"] == "placement_timeout"
    events = [server.stored[seq] for seq in sorted(server.stored)]
    assert [(e["type"], e["data"]["state"]) for e in events] == [("resources", "waiting"), ("resources", "timeout")]
    # Beats from the sink's creation (before torch and Ray were even loaded), every 5 s through the wait.
    beats = [t for t, auth in server.heartbeats if auth == "Bearer tok"]
    assert len(beats) >= 2, beats
    gaps = [b - a for a, b in zip(beats, beats[1:])]
    assert all(3.0 < g < 8.0 for g in gaps), gaps


def test_local_mode_is_ready_at_start_on_the_drivers_node(ray_driver) -> None:
    cfg = TrainConfig.from_dict({**TINY, "mode": "local", "steps": 1, "num_workers": 1})
    cap = Capture()
    result = TrainingRun(cfg, emitter=EventEmitter([cap]), on_step=None).run()
    assert result.status == "succeeded"
    assert cap.events[0]["type"] == "resources"
    ready = cap.events[0]["data"]
    assert ready["state"] == "ready" and ready["waited_s"] == 0
    assert ready["nodes"] == [ray_driver.get_runtime_context().get_node_id()]  # one process: the driver's bundle
    assert cap.of("worker")[0]["device"] == "cpu"


def test_a_stop_while_waiting_removes_the_group_and_cancels_the_run(ray_driver) -> None:
    ray = ray_driver
    cfg = TrainConfig.from_dict({**TINY, "learner_cpus": 64.0, "placement_timeout_s": 600.0})
    cap = Capture()
    run = TrainingRun(cfg, emitter=EventEmitter([cap]))
    groups_before = set(ray.util.placement_group_table())
    threading.Timer(2.0, run.request_stop, args=("test stop",)).start()
    t0 = time.monotonic()
    result = run.run()
    assert result.status == "cancelled" and result.version == 0
    assert time.monotonic() - t0 < 30  # not the 600 s placement timeout
    assert [d["state"] for d in cap.of("resources")] == ["waiting"]
    assert [d["status"] for d in cap.of("status")] == ["stopping", "cancelled"]
    new = {k: v for k, v in ray.util.placement_group_table().items() if k not in groups_before}
    assert len(new) == 1 and next(iter(new.values()))["state"] == "REMOVED"
