"""Real platform processes for execution tests: daphne and Celery workers as subprocesses on the test database,
the shared Ray cluster, and Redis; plus an API client and helpers to wait for run states."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import REPO_ROOT, VENV_BIN, RayCluster, free_port
from tests.processes import committed_database_url, die_with_parent, stop_process_group

# Tiny training run: a few steps of the digits task so a run takes well under a minute on two cores.
TINY_TRAIN_CONFIG: dict[str, Any] = {
    "steps": 6,
    "prompts_per_step": 8,
    "group_size": 4,
    "num_engines": 1,
    "num_workers": 1,
    "worker_capacity": 8,
    "eval_every": 3,
    "eval_prompts": 16,
    "checkpoint_every": 3,
    "d_model": 32,
    "n_layer": 1,
    "n_head": 2,
}


@dataclass
class Platform:
    """The processes of one test's platform; `stop()` ends every one of them (by process group)."""

    env: dict[str, str]
    web_url: str
    log_dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def _start(self, name: str, cmd: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        proc = subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env={**self.env, **(extra_env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),  # gone with a killed test run
        )
        self.procs[name] = proc
        return proc

    def start_web(self) -> None:
        port = self.web_url.rsplit(":", 1)[1]
        self._start("web", [str(VENV_BIN / "daphne"), "-b", "127.0.0.1", "-p", port, "config.asgi:application"])
        wait_for(
            lambda: _http_up(f"{self.web_url}/api/schema/"),
            timeout=60,
            what="daphne to serve",
            on_timeout=lambda: self.log("web"),
        )

    def start_worker(
        self,
        name: str = "worker",
        *,
        beat: bool = True,
        include: str | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        cmd = [
            str(VENV_BIN / "celery"),
            "-A",
            "config",
            "worker",
            "--loglevel",
            "INFO",
            "--concurrency",
            "2",
            "--hostname",
            f"{name}-{uuid.uuid4().hex[:6]}@%h",
            "--without-gossip",
            "--without-mingle",
        ]
        if beat:
            cmd += ["--beat", "--schedule", str(self.log_dir / f"beat-{name}")]
        if include:
            cmd += ["--include", include]
        return self._start(name, cmd, extra_env)

    def kill(self, name: str) -> None:
        """SIGKILL the whole process group (a Celery worker's parent and its pool children at once)."""
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        for name in list(self.procs):
            stop_process_group(self.procs.pop(name), grace=5)

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def _http_up(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code < 500
    except requests.RequestException:
        return False


def wait_for(
    check: Callable[[], Any],
    *,
    timeout: float,
    what: str,
    interval: float = 0.3,
    on_timeout: Callable[[], str] | None = None,
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = on_timeout() if on_timeout else ""
            pytest.fail(f"timed out after {timeout} s waiting for {what}\n{detail}", pytrace=False)
        time.sleep(interval)


@pytest.fixture(scope="session")
def submission_prefix() -> str:
    return f"t{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="session")
def ray_jobs_ready(ray_cluster: RayCluster) -> RayCluster:
    """The shared head takes a while (a minute and more on a loaded machine) before its job agent accepts
    jobs; the platform copes (a run stays `starting` and the tick relaunches it), but fault tests that time
    their kills need launches to go through at once."""
    wait_jobs_accepted(ray_cluster)
    return ray_cluster


def wait_jobs_accepted(ray_cluster: RayCluster) -> None:
    """Until the cluster's job agent accepts a trivial job (fails the test past 240 s)."""
    from ray.job_submission import JobSubmissionClient

    try:
        client = JobSubmissionClient(ray_cluster.dashboard_url)
    except ConnectionError as exc:
        pytest.fail(f"{exc}\n{ray_cluster.postmortem()}", pytrace=False)

    def accepted() -> bool:
        try:
            client.submit_job(entrypoint="true", submission_id=f"warmup-{uuid.uuid4().hex[:8]}")
            return True
        except RuntimeError as exc:
            if "No available agent" in str(exc):
                return False
            raise

    wait_for(accepted, timeout=240, interval=1, what="the Ray job agent to accept jobs")


@pytest.fixture
def ray_settings(ray_jobs_ready: RayCluster, settings, submission_prefix: str) -> RayCluster:
    """This test process's Django settings pointed at the shared Ray cluster, under this session's prefix."""
    settings.RAY_ADDRESS = ray_jobs_ready.dashboard_url
    settings.RAY_SUBMISSION_PREFIX = submission_prefix
    return ray_jobs_ready


@pytest.fixture
def platform(
    transactional_db, ray_jobs_ready: RayCluster, redis_url: str, tmp_path: Path, submission_prefix: str
) -> Iterator[Platform]:
    """Web started; workers are started by the test (it decides which to kill). Everything on the test DB."""
    database_url = committed_database_url("execution tests")
    web_url = f"http://127.0.0.1:{free_port()}"
    env = dict(os.environ)
    ray_cluster = ray_jobs_ready
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "RAY_ADDRESS": ray_cluster.dashboard_url,
            "PLATFORM_PUBLIC_URL": web_url,
            "RUN_ARTIFACTS_DIR": str(tmp_path / "runs"),
            "RAY_SUBMISSION_PREFIX": submission_prefix,
            "CELERY_QUEUE": f"{submission_prefix}-tasks",
            "SCHEDULER_TICK_SECONDS": "1",
            "CELERY_VISIBILITY_TIMEOUT": "10",
            "CELERY_UNACKED_RESTORE_INTERVAL": "1",
            "RUN_STOP_GRACE_SECONDS": "60",
            "SLOTS_HEARTBEAT_TIMEOUT_SECONDS": "120",
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(REPO_ROOT),
            "OMP_NUM_THREADS": "1",
            "DJANGO_SETTINGS_MODULE": "config.settings",
        }
    )
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    plat = Platform(env=env, web_url=web_url, log_dir=log_dir)
    # Admission charges runs against this Ray cluster's real nodes (what the tick reads), not the stand-in node
    # every database test starts with: a tick would otherwise find that node gone and requeue its runs.
    from django.utils import timezone

    from runs.execution.capacity import cluster_refresh
    from runs.models import ClusterNode

    ClusterNode.objects.all().delete()
    assert cluster_refresh(now=timezone.now(), address=ray_cluster.dashboard_url), "the Ray cluster's nodes"
    try:
        plat.start_web()
        yield plat
    finally:
        plat.stop()
        _stop_jobs(ray_cluster, submission_prefix)
    assert_status_paths()


def assert_status_paths() -> None:
    """Every run's status history (ALL its stored `status` events, whoever wrote them: the job's own reports are
    `job_status` events) is a path of runs.core.lifecycle.TRANSITIONS: every one is the platform's, it starts `queued`,
    each event names the status before it as its `previous`, and each move is allowed. So no move is recorded
    twice and no terminal state is followed by another (only a requeue or resume leaves one). Checked after
    every test of a real platform (issue 25, point 2)."""
    from runs.core.events import PLATFORM_SOURCE, STATUS
    from runs.core.lifecycle import TRANSITIONS
    from runs.models import RunEvent

    histories: dict[int, list[dict[str, Any]]] = {}
    rows = RunEvent.objects.filter(type=STATUS).order_by("run_id", "seq")
    for run_id, source, data in rows.values_list("run_id", "source", "data"):
        assert source == PLATFORM_SOURCE, (run_id, source, data)
        histories.setdefault(run_id, []).append(data)
    for run_id, moves in histories.items():
        path = [m.get("status") for m in moves]
        assert moves[0].get("previous") is None and path[0] == "queued", (run_id, path)
        for before, move in zip(path, moves[1:]):
            assert move.get("previous") == before and move.get("status") in TRANSITIONS[before], (run_id, path)


def _stop_jobs(ray_cluster: RayCluster, prefix: str) -> None:
    """Leave no job of this test running on the shared cluster (the next test needs the CPUs)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(ray_cluster.dashboard_url)
    for job in client.list_jobs():
        if (job.submission_id or "").startswith(prefix + "-") and not job.status.is_terminal():
            client.stop_job(job.submission_id)
    wait_for(
        lambda: all(
            j.status.is_terminal() for j in client.list_jobs() if (j.submission_id or "").startswith(prefix + "-")
        ),
        timeout=60,
        what="test jobs to stop",
    )


class Api:
    """A token-authenticated REST client of the platform under test."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"

    def get(self, path: str) -> Any:
        resp = self.session.get(self.base + path, timeout=10)
        assert resp.status_code == 200, f"GET {path}: {resp.status_code} {resp.text}"
        return resp.json()

    def post(self, path: str, body: Any = None, expect: int = 200) -> Any:
        resp = self.session.post(self.base + path, json=body, timeout=30)
        assert resp.status_code == expect, f"POST {path}: {resp.status_code} {resp.text}"
        return resp.json() if resp.content else None

    def patch(self, path: str, body: Any, expect: int = 200) -> Any:
        resp = self.session.patch(self.base + path, json=body, timeout=10)
        assert resp.status_code == expect, f"PATCH {path}: {resp.status_code} {resp.text}"
        return resp.json()

    def run(self, run_id: int) -> dict[str, Any]:
        return self.get(f"/api/runs/{run_id}/")

    def wait_status(
        self, run_id: int, statuses: set[str] | str, *, timeout: float, on_timeout: Callable[[], str] | None = None
    ) -> dict[str, Any]:
        wanted = {statuses} if isinstance(statuses, str) else statuses
        seen: list[str] = []

        def check() -> dict[str, Any] | None:
            run = self.run(run_id)
            if not seen or seen[-1] != run["status"]:
                seen.append(run["status"])
            return run if run["status"] in wanted else None

        return wait_for(
            check, timeout=timeout, what=f"run {run_id} to reach {sorted(wanted)} (seen {seen})", on_timeout=on_timeout
        )


@pytest.fixture
def api(platform: Platform, django_user_model) -> Api:
    from runs.auth.tokens import token_issue

    user = django_user_model.objects.create_user(username="alice", password="pw", is_staff=True)
    return Api(platform.web_url, token_issue(user))


def ray_jobs_of_run(ray_cluster: RayCluster, run_id: int) -> list:
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(ray_cluster.dashboard_url).list_jobs()
    return [j for j in jobs if (j.metadata or {}).get("platform_run") == str(run_id)]


def consumed(events: list[dict[str, Any]]) -> dict[int, list[tuple[int, int]]]:
    """Per trained step, the (group id, epoch) pairs it trained on; a step trained again (after a resume from an
    earlier checkpoint) counts as its latest attempt trained it."""
    out: dict[int, list[tuple[int, int]]] = {}
    for e in events:
        if e["type"] == "train":
            out[e["data"]["step"]] = list(zip(e["data"]["group_ids"], e["data"]["epochs"]))
    return out


def resumed_exactly(events: list[dict[str, Any]], checkpoint_step: int) -> tuple[int, int]:
    """Asserts that a preempted run lost no trained step past its checkpoint and resumed right after it (its
    `resumed` event from that step, its first train step after the `preempted` event the next one); returns (the
    last step trained before the stop, the first after the resume)."""
    preempted = next(e for e in events if e["type"] == "preempted")
    trained_before = max(e["data"]["step"] for e in events if e["type"] == "train" and e["seq"] < preempted["seq"])
    first_after = next(e["data"]["step"] for e in events if e["type"] == "train" and e["seq"] > preempted["seq"])
    resumed = next(e["data"] for e in events if e["type"] == "resumed")
    assert resumed["from_step"] == checkpoint_step and first_after == checkpoint_step + 1
    assert trained_before == checkpoint_step  # no trained step past the last checkpoint was lost
    return trained_before, first_after
