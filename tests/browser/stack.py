"""The real stack the browser tests and bench/dashboard.py drive: a daphne ASGI server on PostgreSQL + Redis,
and a trainer-like emitter that posts real trainer-schema events to the real ingest endpoint with the run's
own token (the path a Ray job takes), so runs progress without waiting for Ray."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from tests.conftest import free_port
from tests.processes import die_with_parent, stop_process_group
from trainer.histograms import histogram, run_edges

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO_ROOT / "tests" / "artifacts"


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log_path: Path
    prefix: str  # the channel-layer prefix: anything publishing to this server's browsers must use it

    def stop(self) -> None:
        stop_process_group(self.proc, grace=10)


def server_start(*, database_url: str, redis_url: str, extra_env: dict[str, str] | None = None) -> Server:
    """Start daphne on a free port against the given database; fail loudly with its log if it does not answer."""
    port = free_port()
    prefix = f"fe{uuid.uuid4().hex[:8]}"
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            # Pub/sub channels are global in Redis: a prefix of our own keeps parallel runs apart.
            "CHANNEL_LAYER_PREFIX": prefix,
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "PYTHONPATH": str(REPO_ROOT),
            **(extra_env or {}),
        }
    )
    log_path = ARTIFACTS / "logs" / f"daphne-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "daphne"), "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent(),  # gone with a killed test run
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daphne exited: {log_path.read_text()[-3000:]}")
        try:
            requests.get(f"{url}/static/dist/app.css", timeout=1)
            return Server(url=url, proc=proc, log_path=log_path, prefix=prefix)
        except requests.RequestException:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"daphne did not answer: {log_path.read_text()[-3000:]}")


@dataclass
class Emitter:
    """Posts trainer-schema events (trainer/events.py) for one run, as the Ray job would."""

    base_url: str
    run_id: int
    token: str
    seq: int = 0
    version: int = 0
    step: int = 0
    consumed: int = 0
    epoch: int = 0
    dataset_size: int = 64
    t: float = field(default_factory=time.time)
    session: requests.Session = field(default_factory=requests.Session)

    def event(self, etype: str, data: dict[str, Any], dt: float = 0.05) -> dict[str, Any]:
        self.seq += 1
        self.t += dt
        return {"seq": self.seq, "ts": self.t, "type": etype, "data": data}

    def post(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        resp = self.session.post(
            f"{self.base_url}/api/runs/{self.run_id}/ingest/",
            json=events,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=10,
        )
        if resp.status_code != 200:
            raise AssertionError(f"ingest refused ({resp.status_code}): {resp.text[:500]}")
        return resp.json()

    def engines(self, state: str) -> list[dict[str, Any]]:
        return [
            {
                "id": f"engine-{i}",
                "state": state,
                "version": self.version,
                "active": 0 if state != "open" else 2,
                "sessions": 3 + i,
                "alive": True,
            }
            for i in range(2)
        ]

    def gate(self, state: str, dt: float) -> dict[str, Any]:
        return self.event(
            "gate",
            {
                "state": state,
                "version": self.version,
                "active": 0 if state != "open" else 4,
                "waiting": 0,
                "engines": self.engines(state),
            },
            dt,
        )

    def histograms(self, samples: int) -> dict[str, Any]:
        """The step's distributions as the trainer sends them (trainer/histograms.py): rewards drift up with
        the step, advantages spread around 0, a fixed response length, staleness 0 or 1."""
        edges = run_edges(group_size=8, max_staleness=1, response_len_max=6)
        x = self.step
        rewards = [min(1.0, (k % 8) / 8 * (1 - math.exp(-0.15 * x)) + 0.1) for k in range(samples)]
        values = {
            "reward": rewards,
            "advantage": [((k % 8) - 3.5) / 2.3 for k in range(samples)],
            "response_length": [6] * samples,
            "staleness": [x % 2] * samples,
        }
        return {key: histogram(v, edges[key]) for key, v in values.items()}

    def start(self) -> list[dict[str, Any]]:
        """What a job emits first: its topology (as the trainer's `started` worker event), gate open at version
        0, the sampler at the start."""
        started = {"event": "started", "engines": ["engine-0"], "workers": 2, "mode": "colocated", "device": "cpu"}
        return [
            self.event("worker", started),
            self.event("version", {"version": 0, "published_at": self.t, "pause_ms": 0.0}),
            self.gate("open", 0.05),
            self.event(
                "sampler", {"epoch": 0, "group_count": 0, "dataset_size": self.dataset_size, "consumed_in_epoch": 0}
            ),
            self.event("log", {"level": "info", "message": "training started"}),
        ]

    def step_events(self, groups: int = 8) -> list[dict[str, Any]]:
        """One training step: a publication (seal, drain, install v+1, reopen), sampler progress, metrics."""
        self.step += 1
        out = [self.gate("sealed", 0.6), self.gate("draining", 0.02), self.gate("installing", 0.08)]
        self.version += 1
        out.append(
            self.event("version", {"version": self.version, "published_at": self.t + 0.05, "pause_ms": 150.0}, 0.05)
        )
        out.append(self.gate("open", 0.01))
        self.consumed += groups
        if self.consumed >= self.dataset_size:
            self.epoch, self.consumed = self.epoch + 1, self.consumed - self.dataset_size
        out.append(
            self.event(
                "sampler",
                {
                    "epoch": self.epoch,
                    "group_count": self.step * groups,
                    "dataset_size": self.dataset_size,
                    "consumed_in_epoch": self.consumed,
                },
            )
        )
        x = self.step
        out.append(
            self.event(
                "train",
                {
                    "step": x,
                    "loss": 1.0 / (1 + 0.3 * x),
                    "reward_mean": 1 - math.exp(-0.15 * x),
                    "exact_match": min(1.0, 0.04 * x),
                    "kl": 0.01,
                    "entropy": 1.2 - 0.01 * x,
                    "staleness_max": x % 2,
                    "histograms": self.histograms(groups * 8),
                },
            )
        )
        if x % 5 == 0:
            out.append(
                self.event(
                    "checkpoint", {"step": x, "version": self.version, "path": f"var/runs/{self.run_id}/ckpt-{x}"}
                )
            )
        return out
