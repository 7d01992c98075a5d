"""The `up` fixture: platform/up.py started as a subprocess on a temporary var/ dir and free ports, with every
process it started remembered so a test can check (and clean) them. Used by tests/security/test_platform_up.py,
test_platform_ray.py, tests/test_capacity.py, tests/test_restart.py and tests/test_platform_quiet.py. Also the
`shared_platform` fixture: one `make run` platform that a test leaves running for a later test to go on with.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from tests.conftest import REPO_ROOT, free_port
from tests.held import Held
from tests.processes import die_with_parent

UP = REPO_ROOT / "platform" / "up.py"


class UpProcess:
    """One `platform/up.py` run; remembers every process it started so the test can check (and clean) them."""

    # The latest up.py started on each var/ dir: only it may remove the Ray temp dir that var/ records (an
    # earlier start on the same var/ dir reads the record of a later one, maybe a live platform handed over
    # to another test; up.py's next start removes the dir of a killed one itself).
    latest: dict[Path, UpProcess] = {}

    def __init__(self, tmp_path: Path, **extra_env: str) -> None:
        self.var_dir = tmp_path / "var"
        UpProcess.latest[self.var_dir] = self
        self.port = free_port()
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in {"DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "RAY_AUTH_MODE", "DJANGO_SECRET_KEY"}
        }
        # These tests are about closing and stopping, not liveness: on a loaded 2-core machine a job's first
        # heartbeat can come after the default 60 s, and a reclaimed run would end the test early.
        env.update(
            {
                "PLATFORM_VAR_DIR": str(self.var_dir),
                "PORT": str(self.port),
                "PYTHONUNBUFFERED": "1",
                "SLOTS_HEARTBEAT_TIMEOUT_SECONDS": "600",
                # Never Ray's default 8265: up.py takes it when it looks free, and two platforms started at once
                # (the suite's and one beside it) both saw it free; the later Ray head failed to bind and its
                # up.py stopped (seen in CI: test_restart).
                "RAY_DASHBOARD_PORT": str(free_port()),
                **extra_env,
            }
        )
        self.log_path = tmp_path / "up.log"
        self.proc = subprocess.Popen(
            [sys.executable, str(UP)],
            cwd=REPO_ROOT,
            env=env,
            start_new_session=True,
            stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(),  # a killed test run takes its platform with it (up.py stops in order)
        )
        self.seen: dict[int, psutil.Process] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def record(self) -> list[psutil.Process]:
        """Every live descendant of up.py, plus everything in the sessions of its children (Ray's workers and
        job drivers run in groups and sessions of their own)."""
        try:
            found = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            found = []
        sessions = {os.getsid(p.pid) for p in found if p.is_running()} - {os.getsid(self.proc.pid)}
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) in sessions:
                    found.append(p)
            except (ProcessLookupError, psutil.Error):
                pass
        for p in found:
            self.seen.setdefault(p.pid, p)
        return found

    def alive(self) -> list[psutil.Process]:
        out = []
        for p in self.seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out

    def wait_for(self, check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"up.py exited while waiting for {what}:\n{self.log()[-4000:]}"
            try:
                if check():
                    self.record()
                    return
            except (requests.RequestException, OSError):
                pass
            time.sleep(0.5)
        pytest.fail(f"timed out waiting for {what}:\n{self.log()[-4000:]}", pytrace=False)

    def wait_gone(self, timeout: float) -> list[psutil.Process]:
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.alive()

    def cleanup(self) -> None:
        """Kill whatever of ours is still there (only processes this test's up.py started)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for p in self.alive():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        record = self.var_dir / "ray-temp-dir"  # what a killed up.py leaves for its next start to remove
        if record.exists() and UpProcess.latest.get(self.var_dir) is self:
            shutil.rmtree(record.read_text().strip(), ignore_errors=True)


class Ups:
    """What the `up` fixture gives a test: `up(**env)` starts up.py on the test's tmp_path; every platform it
    started or adopted is cleaned up after the test, unless handed over (to a Held, for a later test)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[UpProcess] = []

    def __call__(self, **extra_env: str) -> UpProcess:
        return self.adopt(UpProcess(self.tmp_path, **extra_env))

    def again(self, platform: UpProcess) -> UpProcess:
        """up.py started again on the installation (var/) of `platform`, as a second `make run` would be."""
        return self.adopt(UpProcess(platform.var_dir.parent))

    def adopt(self, proc: UpProcess) -> UpProcess:
        self.started.append(proc)
        return proc

    def hand_over(self, proc: UpProcess, held: Held[UpProcess]) -> None:
        self.started.remove(proc)
        held.put(proc)


@pytest.fixture
def up(tmp_path):
    ups = Ups(tmp_path)
    yield ups
    for proc in ups.started:
        proc.cleanup()


def banner(platform: UpProcess) -> UpProcess:
    platform.wait_for(lambda: "The platform is up" in platform.log(), 300, "the banner")
    return platform


# The `make run` platform (with its Ray head; liveness settings the defaults) that tests/test_capacity.py leaves
# running for the Ctrl-C test of tests/security/test_platform_ray.py, which ends it: one start (and one cold Ray
# head) fewer. Tests marked `ends_shared_platform` run after the others that use it (tests/conftest.py).
SHARED_PLATFORM: Held[UpProcess] = Held("shared_platform", UpProcess.cleanup, keep="last")


class SharedPlatform:
    def __init__(self, up: Ups, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.up = up
        self.tmp_path_factory = tmp_path_factory

    def take(self) -> UpProcess:
        """The platform a test before left (`leave`), else a fresh one (its banner out), for this test: cleaned
        up after it unless it leaves it again."""
        platform = SHARED_PLATFORM.take()
        if platform is None:
            # The defaults of config/knobs.py, stated here because UpProcess raises the heartbeat timeout.
            fresh = UpProcess(self.tmp_path_factory.mktemp("make-run"), SLOTS_HEARTBEAT_TIMEOUT_SECONDS="60")
            platform = banner(self.up.adopt(fresh))
        else:
            self.up.adopt(platform)
        return platform

    def leave(self, platform: UpProcess) -> None:
        """Leave the platform running for a later test; a test calls this once its assertions passed (a failed
        test's platform may still be busy with its runs, and is cleaned up with the test)."""
        self.up.hand_over(platform, SHARED_PLATFORM)


@pytest.fixture
def shared_platform(up: Ups, tmp_path_factory: pytest.TempPathFactory) -> SharedPlatform:
    return SharedPlatform(up, tmp_path_factory)


def start_without_ray(up) -> UpProcess:
    """up.py with Redis, web, worker and tick (Ray pointed at a closed port: launches just wait), verbose: its
    terminal shows every tick."""
    platform = up(RAY_ADDRESS=f"http://127.0.0.1:{free_port()}", VERBOSE="1")
    platform.wait_for(lambda: requests.get(f"{platform.url}/admin/login/", timeout=2).ok, 180, "the web server")
    # The worker's prefork pool and the tick are up once beat has sent a tick and the worker ran it.
    platform.wait_for(lambda: "Task runs.tasks.tick" in platform.log(), 120, "the first tick")
    return platform


def names(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(" ".join(p.cmdline())[:120])
        except psutil.Error:
            pass
    return out


def trainer_pids(procs: list[psutil.Process]) -> set[int]:
    return {p.pid for p in procs if any("trainer run" in cmd for cmd in names([p]))}
