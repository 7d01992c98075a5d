"""Acceptance (issue 11): with Ray out of reach for 3 minutes while 3 runs are queued or starting, no run fails;
when Ray is back, they run to success. Two kinds of outage:
- `restart`: the Ray head is stopped, then started again (new node ids). The runs granted meanwhile had their
  placement on a node that is gone: node loss puts them back in the queue, and they are granted afresh.
- `partition`: the platform loses its way to a Ray head that keeps running (tests/execution/gateway.py cuts
  the TCP path to the dashboard port). Nothing is requeued: the runs granted during the outage keep their
  grant and are launched when the path is back. The launch timeout is set shorter than the outage (issue 25),
  so this case fails if the outage counts against a starting run's launch window (the launch clock restarts
  when Ray is reachable again: runs/execution/liveness.py). A restart cannot show that: its node loss gives
  the runs a new grant, and a new launch window, whatever the launch clock does.

A platform of its own (daphne, a Celery worker with the beat: the tick) on the test database, against a Ray head
of its own, reached through the gateway; the test stops and starts that head on the same ports (by its process
group; no other Ray on the machine is touched). The outage length is a parameter: RAY_OUTAGE_SECONDS (default
180, what the suite runs).
Marked `outage` (and `slow`): each case takes about 4 to 8 minutes, mostly the outage itself and three training
runs on two cores, so they run in a pytest process of their own beside the rest of the suite (marked `beside`:
`make test` runs `-m beside` there)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import requests

from runs.models import ClusterStatus, Run, RunStatus
from runs.telemetry.dashboard import cluster_snapshot
from tests.conftest import REPO_ROOT, VENV_BIN, free_port, head_command, port_clashed
from tests.execution.conftest import TINY_TRAIN_CONFIG, Api, Platform, wait_for
from tests.execution.gateway import Gateway
from tests.processes import committed_database_url, die_with_parent, stop_ray_head

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.outage, pytest.mark.beside]

OUTAGE_SECONDS = float(os.environ.get("RAY_OUTAGE_SECONDS", "180"))
LIVENESS_SETTINGS = (
    "SLOTS_HEARTBEAT_TIMEOUT_SECONDS",
    "SLOTS_HEARTBEAT_HARD_TIMEOUT_SECONDS",
    "RUN_LAUNCH_TIMEOUT_SECONDS",
)
RUN_CONFIG = {**TINY_TRAIN_CONFIG, "steps": 3, "eval_every": 3, "checkpoint_every": 3}
# Shorter than the outage: the runs granted while Ray is down are starting for longer than this when it is back,
# so any liveness check during the outage, or a launch clock that counted the outage, fails them (then the test);
# and each still has this long, counted from Ray's return, to be running (a launch takes well under a minute).
LAUNCH_TIMEOUT_S = int(OUTAGE_SECONDS) - 30


class OwnHead:
    """One Ray head on fixed ports and its own temp dir; stop() ends its process group, start() brings it back."""

    def __init__(self, temp_dir: str) -> None:
        self.temp_dir = temp_dir
        self.ports = {name: free_port() for name in ("gcs", "dashboard", "agent", "client", "metrics")}
        self.dashboard_url = f"http://127.0.0.1:{self.ports['dashboard']}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        env = {
            **os.environ,
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(REPO_ROOT),
        }
        first = self.starts == 0
        for _ in range(3):
            cmd = head_command(ports=self.ports, temp_dir=self.temp_dir)
            self.starts += 1
            log_path = Path(self.temp_dir) / f"head-{self.starts}.log"
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=open(log_path, "w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
            clashed = partial(port_clashed, self.proc, log_path)
            wait_for(
                lambda: clashed() or self.serving(),  # noqa: B023 - called within this iteration only
                timeout=240,
                interval=1,
                what="the Ray head's job API",
                on_timeout=self.log,
            )
            if not clashed():
                return
            stop_ray_head(self.proc)
            # Ray's own pick hit one of ours. The first start takes fresh ports; a restart keeps them (the
            # platform's address names the dashboard port) and Ray picks its own afresh.
            if first:
                self.ports = {name: free_port() for name in self.ports}
                self.dashboard_url = f"http://127.0.0.1:{self.ports['dashboard']}"
        pytest.fail(f"the test's Ray head hit a port clash at three starts in a row: {self.log()}")

    def serving(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log()
        try:
            return requests.get(f"{self.dashboard_url}/api/version", timeout=2).status_code in (200, 401)
        except requests.RequestException:
            return False

    def stop(self) -> None:
        stop_ray_head(self.proc)
        self.proc = None

    def log(self) -> str:
        path = Path(self.temp_dir) / f"head-{self.starts}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@pytest.fixture
def own_head() -> Iterator[OwnHead]:
    head = OwnHead(tempfile.mkdtemp(prefix="ray-outage-"))
    try:
        head.start()
        yield head
    finally:
        head.stop()
        shutil.rmtree(head.temp_dir, ignore_errors=True)


@pytest.fixture
def gateway(own_head: OwnHead) -> Iterator[Gateway]:
    path = Gateway(target_port=own_head.ports["dashboard"], port=free_port())
    path.mend()
    try:
        yield path
    finally:
        path.cut()


@pytest.fixture
def own_platform(transactional_db, gateway: Gateway, redis_url: str, tmp_path: Path) -> Iterator[Platform]:
    database_url = committed_database_url("the outage test")
    web_url = f"http://127.0.0.1:{free_port()}"
    prefix = f"outage{os.getpid()}"
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "RAY_ADDRESS": gateway.url,
        "PLATFORM_PUBLIC_URL": web_url,
        "RUN_ARTIFACTS_DIR": str(tmp_path / "runs"),
        "RAY_SUBMISSION_PREFIX": prefix,
        "CELERY_QUEUE": f"{prefix}-tasks",
        "SCHEDULER_TICK_SECONDS": "2",
        "CELERY_VISIBILITY_TIMEOUT": "10",
        "CELERY_UNACKED_RESTORE_INTERVAL": "1",
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO_ROOT),
        "OMP_NUM_THREADS": "1",
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    # Heartbeat settings are the defaults (60 s, hard 600 s). The launch timeout is shorter than the outage
    # (LAUNCH_TIMEOUT_S): with the default 900 s no run could time out here, and the test would pass without the
    # guards it exists for (no liveness while Ray is unreachable; the launch clock restarts when it is back).
    for name in ("SLOTS_HEARTBEAT_TIMEOUT_SECONDS", "SLOTS_HEARTBEAT_HARD_TIMEOUT_SECONDS"):
        env.pop(name, None)
    env["RUN_LAUNCH_TIMEOUT_SECONDS"] = str(LAUNCH_TIMEOUT_S)
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    plat = Platform(env=env, web_url=web_url, log_dir=log_dir)
    try:
        plat.start_web()
        plat.start_worker()
        yield plat
    finally:
        plat.stop()


def cluster_reachable() -> bool | None:
    return ClusterStatus.objects.values_list("reachable", flat=True).first()


@pytest.mark.parametrize("kind", ["restart", "partition"])
def test_runs_survive_a_ray_outage_and_then_succeed(own_platform, own_head, gateway, django_user_model, kind):
    from runs.auth.tokens import token_issue

    outage_s = OUTAGE_SECONDS
    assert 0 < LAUNCH_TIMEOUT_S < outage_s, "the launch timeout must be shorter than the outage"
    cut, mend = (own_head.stop, own_head.start) if kind == "restart" else (gateway.cut, gateway.mend)

    started = time.monotonic()
    user = django_user_model.objects.create_user(username="ops", password="pw", is_staff=True)
    api = Api(own_platform.web_url, token_issue(user))

    def logs() -> str:
        """What the tick's last read of Ray said (why it was unreachable), then the worker's log."""
        status = ClusterStatus.objects.values("reachable", "message").first()
        return f"cluster: {status}\n{own_platform.log('worker')}"

    wait_for(lambda: cluster_reachable() is True, timeout=120, what="the tick to read the cluster", on_timeout=logs)

    cut()
    wait_for(lambda: cluster_reachable() is False, timeout=60, what="the tick to see Ray gone", on_timeout=logs)
    assert cluster_snapshot()["reachable"] is False  # what the board's banner is driven by
    ids = [
        api.post(
            "/api/runs/", {"name": f"outage-{i}", "origin": "api", "kind": "rl_train", "config": RUN_CONFIG}, expect=201
        )["id"]
        for i in range(3)
    ]
    outage_started = time.monotonic()
    while time.monotonic() - outage_started < outage_s:
        statuses = dict(Run.objects.filter(pk__in=ids).values_list("pk", "status"))
        assert set(statuses.values()) <= {RunStatus.QUEUED, RunStatus.STARTING}, (statuses, logs())
        time.sleep(5)
    # Granted during the outage, so starting for longer than the launch timeout when Ray is back: what the launch
    # clock's restart has to save.
    granted_in_outage = {pk: at for pk, at in Run.objects.filter(pk__in=ids).values_list("pk", "granted_at") if at}
    assert granted_in_outage, (statuses, logs())

    mend()
    for run_id in ids:
        run = api.wait_status(
            run_id, {"succeeded", "failed", "cancelled"}, timeout=900, on_timeout=lambda: logs() + own_head.log()
        )
        assert run["status"] == "succeeded", (run, logs())
    for run in Run.objects.filter(pk__in=ids):
        failures = run.events.filter(type="status", data__status="failed")
        assert not failures.exists(), [e.data for e in failures]
        if kind == "partition" and run.pk in granted_in_outage:
            # The same node came back: the grant made during the outage is the one that ran (no requeue).
            moves = list(run.events.filter(type="status").order_by("seq").values_list("data__status", flat=True))
            assert moves == ["queued", "starting", "running", "succeeded"], (run.pk, moves)
    print(f"\noutage test ({kind}): {outage_s:.0f} s outage, {time.monotonic() - started:.0f} s in all")
