"""Faults on real processes: a Celery worker SIGKILLed while it launches (exactly one Ray job afterwards, the
run reaches `running` through Celery's redelivery), a worker SIGKILLed during a run (the job keeps going and
its end is recorded), and a Ray job killed (the run fails with the reason within 10 s, slot released)."""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest

from runs.models import Slot
from tests.execution.conftest import TINY_TRAIN_CONFIG, ray_jobs_of_run, wait_for
from tests.execution.test_lifecycle import status_history

pytestmark = pytest.mark.slow

# A run that lasts long enough to be killed in the middle (it is cancelled or killed before it ends).
LONG_TRAIN_CONFIG = {**TINY_TRAIN_CONFIG, "steps": 400}
LAUNCH_S = 19  # seconds; see test_worker_killed_while_launching_leaves_exactly_one_job


def submit(api, config: dict, name: str = "fault") -> dict:
    return api.post("/api/runs/", {"name": name, "origin": "api", "config": config}, expect=201)


def test_worker_killed_while_launching_leaves_exactly_one_job(platform, api, ray_cluster):
    # This worker stalls between submitting the Ray job and recording the run as running.
    platform.start_worker("stalling", beat=False, include="tests.execution.stall_launch")
    run = submit(api, LONG_TRAIN_CONFIG)
    wait_for(
        lambda: ray_jobs_of_run(ray_cluster, run["id"]),
        timeout=90,
        what="the Ray job to be submitted",
        on_timeout=lambda: platform.log("stalling"),
    )
    assert api.run(run["id"])["status"] == "starting"
    platform.kill("stalling")
    killed_at = time.monotonic()

    # No tick runs: only Celery's redelivery of the unacknowledged launch task can launch it again. The launcher
    # leaves the run `starting` (the job's `resources: ready` event makes it `running`), so the redelivery is
    # seen in the fresh worker's log: the launch task done there, finding the job already submitted.
    platform.start_worker("fresh", beat=False)
    wait_for(
        lambda: re.search(r"runs\.tasks\.dispatch_run\[[^\]]+\] succeeded", platform.log("fresh")),
        timeout=60,
        what="the redelivered launch task to finish",
        on_timeout=lambda: platform.log("fresh"),
    )
    redelivered_s = time.monotonic() - killed_at
    api.wait_status(run["id"], "running", timeout=120, on_timeout=lambda: platform.log("fresh"))
    jobs = ray_jobs_of_run(ray_cluster, run["id"])
    assert len(jobs) == 1, [j.submission_id for j in jobs]
    assert api.run(run["id"])["status"] == "running"
    print(f"launch redelivered and recorded {redelivered_s:.1f} s after the SIGKILL")
    # docs/operations.md: the task is handed on after the visibility timeout plus one restore sweep, counted
    # from its delivery (before the stall, so before the kill), then launched. LAUNCH_S covers the redelivered
    # launch on a loaded two-core machine: the fresh worker's start overlaps the timeout, but the launch itself
    # (Ray job lookup, run update) and this test's polling came on top: 1-2 s on a quiet machine (docs: 11-13 s
    # in all), 7.6 s measured at a load average of 20. LAUNCH_S = 19 is 2.5x that worst case; kombu's defaults
    # (restore every 10 s x throttle 10) took ~100 s, and a visibility timeout of 45 s fails this bound.
    visibility_s = float(platform.env["CELERY_VISIBILITY_TIMEOUT"])
    restore_s = float(platform.env["CELERY_UNACKED_RESTORE_INTERVAL"])
    bound_s = visibility_s + restore_s + LAUNCH_S
    assert redelivered_s < bound_s, (redelivered_s, bound_s)

    # A second delivery of the launch (the redelivered task not acknowledged, or restored twice) would come one
    # visibility timeout and a sweep later: waiting that long is the point here, not synchronisation.
    time.sleep(visibility_s + 2 * restore_s)
    jobs = ray_jobs_of_run(ray_cluster, run["id"])
    assert len(jobs) == 1, [j.submission_id for j in jobs]
    assert api.run(run["id"])["status"] == "running"


def test_worker_killed_during_a_run_the_run_still_finishes(platform, api, ray_cluster):
    platform.start_worker("first")
    run = submit(api, TINY_TRAIN_CONFIG)
    api.wait_status(run["id"], "running", timeout=120, on_timeout=lambda: platform.log("first"))
    platform.kill("first")
    seq_at_kill = api.run(run["id"])["summary"].get("train", {}).get("step", 0)

    # The job does not depend on the worker: it keeps training and posting events to the web process.
    wait_for(
        lambda: api.run(run["id"])["summary"].get("train", {}).get("step", 0) > seq_at_kill,
        timeout=120,
        what="training progress while no worker runs",
    )
    platform.start_worker("second")
    done = api.wait_status(run["id"], {"succeeded", "failed"}, timeout=180, on_timeout=lambda: platform.log("second"))
    assert done["status"] == "succeeded", done["error"]
    assert done["summary"]["train"]["step"] == TINY_TRAIN_CONFIG["steps"]
    assert status_history(api, run["id"]) == ["queued", "starting", "running", "succeeded"]
    assert len(ray_jobs_of_run(ray_cluster, run["id"])) == 1  # re-attached, never relaunched


def entrypoint_process(run_id: int, artifacts_dir: str) -> psutil.Process | None:
    marker = os.path.join(artifacts_dir, str(run_id), "config.json")
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "trainer" in cmdline and marker in cmdline:
            return proc
    return None


def test_killed_ray_job_fails_the_run_within_10_s(platform, api, ray_cluster):
    platform.start_worker()
    run = submit(api, LONG_TRAIN_CONFIG)
    api.wait_status(run["id"], "running", timeout=120, on_timeout=lambda: platform.log("worker"))
    proc = wait_for(
        lambda: entrypoint_process(run["id"], platform.env["RUN_ARTIFACTS_DIR"]),
        timeout=30,
        what="the job's entrypoint process",
    )
    os.kill(proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()

    failed = api.wait_status(run["id"], {"failed", "succeeded", "cancelled"}, timeout=10)
    elapsed = time.monotonic() - killed_at
    assert failed["status"] == "failed"
    # Ray runs the entrypoint through a shell, which reports the SIGKILLed python as 137 (128 + 9).
    assert re.search(r"failed with exit code (137|-9)", failed["error"]), failed["error"]
    assert failed["error"].startswith(f"Ray job {ray_jobs_of_run(ray_cluster, run['id'])[0].submission_id} failed")
    assert not Slot.objects.filter(run_id=run["id"]).exists()
    print(f"killed job recorded as failed after {elapsed:.1f} s")
