"""Shared fixtures: one real Ray cluster per test run, and loud failures when a service is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from tests.held import release_unneeded
from tests.processes import die_with_parent, stop_ray_head

# Ray 2.60's `ray start` turns token authentication on when ~/.ray/auth_token exists (and refuses to start with
# RAY_AUTH_MODE=token when it does not); job API clients only send the token with RAY_AUTH_MODE=token. So pick
# the mode the head will take, for this process and everything it starts, before any test module imports ray.
if "RAY_AUTH_MODE" not in os.environ:
    _has_token = bool(os.environ.get("RAY_AUTH_TOKEN")) or (Path.home() / ".ray" / "auth_token").exists()
    os.environ["RAY_AUTH_MODE"] = "token" if _has_token else "disabled"

REPO_ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

# The ports the tests give their servers: platform/up.py's own pick (outside the kernel's ephemeral range).
sys.path.insert(0, str(REPO_ROOT / "platform"))
from embedded import free_port  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """STATIC_ROOT exists, private like platform/up.py makes it: without it WhiteNoise warns at every handler
    load (284 identical warnings in a suite run, hiding any other)."""
    from django.conf import settings

    static = Path(settings.STATIC_ROOT)
    for folder in (static.parent, static):
        folder.mkdir(mode=0o700, exist_ok=True)  # the pytest beside the suite may make it first


@dataclass(frozen=True)
class RayCluster:
    address: str  # GCS address for ray.init(address=...)
    dashboard_url: str  # job submission API
    temp_dir: str
    head_pid: int = 0  # the `ray start --block` process (0: not known)

    def postmortem(self) -> str:
        """Whether the head still runs, and the tails of its logs: `ray start --block` ends the whole head when
        any one of its processes dies and says which in head.log; the component logs say why."""
        alive = "unknown"
        if self.head_pid:
            try:
                os.kill(self.head_pid, 0)
                alive = "running"
            except ProcessLookupError:
                alive = "gone"
        parts = [f"Ray head pid {self.head_pid}: {alive}"]
        logs = Path(self.temp_dir) / "session_latest" / "logs"
        for path in [Path(self.temp_dir) / "head.log"] + [
            logs / name
            for name in (
                "dashboard.log",
                "dashboard.err",
                "gcs_server.out",
                "gcs_server.err",
                "raylet.out",
                "raylet.err",
                "monitor.log",
                "log_monitor.log",
            )
        ]:
            if path.exists() and path.stat().st_size:
                lines = path.read_text(errors="replace").splitlines()[-15:]
                parts.append(f"--- {path.name} ---\n" + "\n".join(lines))
        return "\n".join(parts)


# What `ray start` says when a port it picked for one of its own components is one we chose for another: our
# free_port() gives each port back before Ray binds it, so Ray's own random pick can land on it (seen once in a
# few hundred starts). The head exits at once; a start on fresh ports is the cure.
PORT_CLASH = "is trying to use a port number"


def port_clashed(head: subprocess.Popen, log_path: Path) -> bool:
    """Whether the head exited because of a port clash (PORT_CLASH)."""
    return head.poll() is not None and log_path.exists() and PORT_CLASH in log_path.read_text(errors="replace")


def _wait_for_job_api(cluster: RayCluster, head: subprocess.Popen, log_path: Path) -> bool:
    """True once the job API answers; False when the head exited on a port clash; fails the test otherwise."""
    import requests

    # Generous: on a loaded two-core machine the dashboard has taken more than 90 s to answer.
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if port_clashed(head, log_path):
            return False
        if head.poll() is not None:
            pytest.fail(f"Ray head exited: {log_path.read_text()[-2000:]}", pytrace=False)
        try:
            # 401: serving, with token authentication on (clients send the token: RAY_AUTH_MODE=token).
            if requests.get(f"{cluster.dashboard_url}/api/version", timeout=2).status_code in (200, 401):
                return True
        except requests.RequestException:
            pass
        time.sleep(0.5)
    stop_ray_head(head)
    pytest.fail(f"Ray job API did not come up: {log_path.read_text()[-2000:]}", pytrace=False)


def head_command(*, ports: dict[str, int], temp_dir: str) -> list[str]:
    """`ray start` of a test head in the foreground (--block: ending its process group stops exactly this cluster
    and no other Ray on the machine, which Ray's own stop command would kill too), on the given ports and temp
    dir."""
    return [
        str(VENV_BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--num-cpus",
        "4",
        "--port",
        str(ports["gcs"]),
        "--dashboard-host",
        "127.0.0.1",
        "--dashboard-port",
        str(ports["dashboard"]),
        # Ports Ray otherwise fixes (agent HTTP 52365, client server 10001): a second head on the machine whose
        # job agent cannot bind answers every job submission with "No available agent" forever.
        "--dashboard-agent-listen-port",
        str(ports["agent"]),
        "--ray-client-server-port",
        str(ports["client"]),
        "--metrics-export-port",
        str(ports["metrics"]),
        "--temp-dir",
        temp_dir,
        "--include-dashboard",
        "true",
        "--disable-usage-stats",
    ]


@dataclass
class _StartedHead:
    cluster: RayCluster
    proc: subprocess.Popen
    log: IO[str]


# The shared head, started as soon as the session knows that one of its tests will use it (collection done):
# it comes up while the database tests run, instead of blocking the first Ray test (90 s and more when loaded).
_head: _StartedHead | None = None


def _head_start() -> _StartedHead:
    port, dash_port = free_port(), free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray-tests-")
    env = dict(os.environ)
    # Jobs run `python ...` from the raylet's PATH: make that the interpreter of this test run.
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    cmd = head_command(
        ports={"gcs": port, "dashboard": dash_port, **{k: free_port() for k in ("agent", "client", "metrics")}},
        temp_dir=temp_dir,
    )
    log = open(Path(temp_dir) / "head.log", "w")
    # Started from the main thread (pytest_collection_finish or the fixture): die_with_parent ties it to it.
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent()
    )
    cluster = RayCluster(
        address=f"127.0.0.1:{port}", dashboard_url=f"http://127.0.0.1:{dash_port}", temp_dir=temp_dir, head_pid=proc.pid
    )
    return _StartedHead(cluster=cluster, proc=proc, log=log)


def _head_stop(head: _StartedHead) -> None:
    stop_ray_head(head.proc)
    head.log.close()
    shutil.rmtree(head.cluster.temp_dir, ignore_errors=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the shared Ray head in the background if a selected test uses it (see ray_cluster)."""
    global _head
    if _head is None and any("ray_cluster" in getattr(item, "fixturenames", ()) for item in session.items):
        _head = _head_start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A head started for tests that never ran (a failed collection, -x, Ctrl-C) goes with the session."""
    global _head
    if _head is not None:
        _head_stop(_head)
        _head = None


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """A local Ray head shared by every test of this run (starting one costs ~5 s and a lot of memory), started
    in the background once the session's tests are collected (pytest_collection_finish)."""
    global _head
    head = _head if _head is not None else _head_start()
    _head = None  # this fixture stops it now
    for _ in range(3):
        if _wait_for_job_api(head.cluster, head.proc, Path(head.cluster.temp_dir) / "head.log"):
            break
        _head_stop(head)  # a port clash: once more, on fresh ports
        head = _head_start()
    else:
        pytest.fail("the shared Ray head hit a port clash at three starts in a row", pytrace=False)
    cluster = head.cluster
    os.environ["RAY_ADDRESS_FOR_TESTS"] = cluster.address
    try:
        yield cluster
    finally:
        if head.proc.poll() is not None:  # died during the run: say why in the session's output before it is removed
            code = head.proc.returncode
            report = f"\nThe shared Ray head died during the run (exit {code}):\n{cluster.postmortem()}\n"
            sys.__stderr__.write(report)  # past pytest's capture: the teardown of a passing test shows nothing
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        except Exception:
            pass
        _head_stop(head)


@pytest.fixture(scope="session")
def ray_driver(ray_cluster: RayCluster):
    """This test process connected as a Ray driver to the shared cluster."""
    import ray

    if not ray.is_initialized():
        try:
            ray.init(
                address=ray_cluster.address,
                log_to_driver=False,
                runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}},
            )
        except Exception as exc:
            pytest.fail(
                f"could not connect to the shared Ray cluster: {exc}\n{ray_cluster.postmortem()}", pytrace=False
            )
    return ray


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis the tests use; fails loudly (no skip) when it is not reachable."""
    import redis

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis.from_url(url).ping()
            return url
        except Exception as exc:  # noqa: BLE001
            if time.monotonic() > deadline:
                pytest.fail(f"Redis at {url} is not reachable ({exc}); start it (see .ci/run)", pytrace=False)
            time.sleep(0.5)


# A node as big as no test run will ask for: CPUs and GPUs in Ray's units, memory in bytes.
TEST_NODE_TOTAL = {"CPU": 1000.0, "GPU": 64.0, "memory": 1 << 40}


@pytest.fixture(autouse=True)
def cluster_capacity(request: pytest.FixtureRequest):
    """Configuration of the boundary, not behaviour under test: admission grants only what fits the alive
    ClusterNode rows (written by the tick from Ray), and with no rows it grants nothing. So every database test
    starts with one large alive node ("test-node"), and tests that submit runs keep their meaning. Tests about
    capacity replace it with their own nodes (delete the rows, create theirs). Tests without the database get
    nothing."""
    marker = request.node.get_closest_marker("django_db")
    uses_db = marker is not None or {"db", "transactional_db"} & set(request.fixturenames)
    if not uses_db:
        yield None
        return
    transactional = "transactional_db" in request.fixturenames or bool(
        marker and (marker.kwargs.get("transaction") or (marker.args and marker.args[0]))
    )
    request.getfixturevalue("transactional_db" if transactional else "db")
    from django.utils import timezone

    from runs.models import ClusterNode

    node, _ = ClusterNode.objects.update_or_create(
        node_id="test-node",
        defaults={"address": "127.0.0.1", "alive": True, "total": TEST_NODE_TOTAL, "seen_at": timezone.now()},
    )
    yield node
    # The dashboard publisher (a daemon thread) sends after commits, reading the database as it sends: what the
    # test left offered is dropped, and a send in progress ends before the database is torn down.
    from runs.core.publish import dashboard_publisher_discard

    assert dashboard_publisher_discard(), "a dashboard send outlived the test by 10 s"


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the test's own teardown: release the held resources (tests/held.py) the next test does not use."""
    release_unneeded(nextitem)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that ends the shared `make run` platform (marker `ends_shared_platform`, tests/platform_up.py) runs
    right after the last other test that uses it (pytest-django has grouped the tests by database use already;
    these use none, so they stay in their group)."""
    enders = [item for item in items if item.get_closest_marker("ends_shared_platform")]
    sharers = [i for i, item in enumerate(items) if "shared_platform" in item.fixturenames and item not in enders]
    if not enders or not sharers:
        return
    after = items[sharers[-1]]
    for item in enders:
        items.remove(item)
    at = items.index(after) + 1
    items[at:at] = enders
