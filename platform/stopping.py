"""How `make run` stops (platform/up.py): in order, so that no run is lost. Tick and worker first (nothing is
launched once the stop began), then this installation's Ray jobs (each writes a checkpoint while the web process
still takes its events), then the runs those jobs belonged to go back to the queue to resume at the next start
(`manage.py runs_interrupted --stopping`, runs/execution/restart.py), then Ray, web and Redis.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from supervise import Supervisor

REPO = Path(__file__).resolve().parent.parent
# Seconds a child gets after SIGTERM before its process group is SIGKILLed: a Celery warm shutdown finishes the
# task at hand (a launch waits up to 30 s for Ray's job agent); Ray stops its own processes.
WORKER_STOP_SECONDS = 40
RAY_STOP_SECONDS = 30
# `manage.py runs_interrupted`: a Django start and one read of each job.
REQUEUE_SECONDS = 120
RETRY_PAUSE_S = 2.0  # between attempts of the start's requeue
RESTOP_SECONDS = 5.0  # a job not ended this long after its stop is asked again


def say(message: str) -> None:
    """Print a status line; a closed terminal (SIGHUP) must not interrupt the stop."""
    try:
        print(message, flush=True)
    except (OSError, ValueError):
        pass


def stop_ray_jobs(env: dict[str, str], timeout: float, hurry: threading.Event) -> None:
    """Stop this installation's running Ray jobs (the platform's stop: SIGINT, the trainer checkpoints, Ray
    SIGKILLs after RUN_STOP_GRACE_SECONDS) and wait, at most `timeout` seconds, until Ray reports each ended."""
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        # What the children got, read by Ray's token loader when ray is first imported in this process.
        if key in env:
            os.environ[key] = env[key]
        else:
            os.environ.pop(key, None)
    try:
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(env["RAY_ADDRESS"])
        prefix = env.get("RAY_SUBMISSION_PREFIX", "rlrun") + "-"
        jobs = [
            j.submission_id
            for j in client.list_jobs()
            if (j.submission_id or "").startswith(prefix) and not j.status.is_terminal()
        ]
        for job in jobs:
            say(f"stopping Ray job {job} (it writes a checkpoint) ...")
            client.stop_job(job)
        deadline = time.monotonic() + timeout
        asked = time.monotonic()
        while jobs and time.monotonic() < deadline and not hurry.is_set():
            jobs = [j for j in jobs if not client.get_job_status(j).is_terminal()]
            if time.monotonic() - asked >= RESTOP_SECONDS:
                # Ray's stop is fire-and-forget and answers False (nothing sent) for a job whose supervisor it
                # cannot find yet; asking again is harmless (the driver checkpoints once) and may be needed.
                for job in jobs:
                    client.stop_job(job)
                asked = time.monotonic()
            time.sleep(1)
        if jobs:
            say(f"Ray jobs still running after {timeout:.0f} s: {', '.join(jobs)}; stopping Ray")
    except Exception as exc:  # noqa: BLE001 - Ray down or unreachable: nothing more to stop there
        say(f"could not stop the Ray jobs: {exc}")


def stop_platform(supervisor: Supervisor, env: dict[str, str], hurry: threading.Event) -> None:
    """The ordered stop: nothing launches once it began, jobs checkpoint while web and Redis still take their
    events, Ray goes before the services its jobs report to."""

    def grace(seconds: float) -> float:
        return 0 if hurry.is_set() else seconds

    # The leaders only: SIGTERM to the worker's whole group would end its pool processes mid-task (a launch
    # lost halfway, WorkerLostError in the terminal) instead of the warm shutdown that lets them finish.
    supervisor.stop(["tick", "worker"], grace=grace(WORKER_STOP_SECONDS), hurry=hurry, leaders_only=True)
    if "ray" in supervisor.children and not supervisor.children["ray"].exited():
        stop_ray_jobs(env, timeout=grace(int(env.get("RUN_STOP_GRACE_SECONDS", "60")) + 15), hurry=hurry)
        if not hurry.is_set():  # hurried: the next start requeues them instead
            runs_interrupted(env, "stopping")
    supervisor.stop(["ray"], grace=grace(RAY_STOP_SECONDS), hurry=hurry)
    supervisor.stop(["web"], grace=grace(10), hurry=hurry)
    supervisor.stop(["redis"], grace=grace(10), hurry=hurry)


def runs_interrupted(env: dict[str, str], when: str, timeout: float = REQUEUE_SECONDS) -> bool:
    """`manage.py runs_interrupted --<when>` ("stopping" or "starting"); says how many runs were requeued. A
    failure is said, not fatal: the next start (or, failing that, the tick) deals with those runs. True when it
    read every job and did its work."""
    try:
        result = subprocess.run(
            [sys.executable, str(REPO / "manage.py"), "runs_interrupted", f"--{when}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=max(1.0, timeout),
        )
    except subprocess.TimeoutExpired:
        say(f"requeueing the interrupted runs took over {int(timeout)} s; left to the next start")
        return False
    lines = (result.stdout if result.returncode == 0 else result.stderr or result.stdout).strip().splitlines()
    line = lines[-1] if lines else "no output"
    if result.returncode != 0:
        say(f"could not requeue the interrupted runs ({line})")
        return False
    if not line.startswith("0 run"):
        say(line)
    return True


def runs_interrupted_at_start(
    env: dict[str, str],
    deadline_s: float = REQUEUE_SECONDS,
    attempt: Callable[[dict[str, str], str, float], bool] = runs_interrupted,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """`runs_interrupted(env, "starting")` until it has read every job, for up to `deadline_s`: a fresh Ray may not
    answer its job API at once, and a run left `running` for the tick would be failed as lost with its node (the
    old cluster's). True when it succeeded."""
    end = clock() + deadline_s
    while True:
        if attempt(env, "starting", end - clock()):
            return True
        if clock() + RETRY_PAUSE_S >= end:
            return False
        sleep(RETRY_PAUSE_S)
