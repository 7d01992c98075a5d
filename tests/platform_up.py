"""The `up` fixture: platform/up.py started as a subprocess on a temporary var/ dir and free ports, with every
process it started remembered so a test can check (and clean) them. Used by tests/security/test_platform_up.py,
test_platform_ray.py, tests/test_capacity.py and tests/test_platform_quiet.py."""

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
from tests.processes import die_with_parent

UP = REPO_ROOT / "platform" / "up.py"


class UpProcess:
    """One `platform/up.py` run; remembers every process it started so the test can check (and clean) them."""

    def __init__(self, tmp_path: Path, **extra_env: str) -> None:
        self.var_dir = tmp_path / "var"
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
        if record.exists():
            shutil.rmtree(record.read_text().strip(), ignore_errors=True)


@pytest.fixture
def up(tmp_path):
    started: list[UpProcess] = []

    def start(**extra_env: str) -> UpProcess:
        proc = UpProcess(tmp_path, **extra_env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.cleanup()


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
