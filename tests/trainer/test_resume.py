"""Exact resume on Ray: N+M uninterrupted steps == N steps, SIGKILL during the next in-flight batch, resume, M."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.wait import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
N, M = 2, 2
# Tool calls of 1.5 s make a batch last several seconds (0.1 s made it 0.5-0.8 s): longer than the trainer's 2 s
# heartbeat, whose `sampler` event is what shows the test that batch N+1 is in flight before it kills.
CONFIG = {
    "mode": "colocated",
    "max_staleness": 0,
    "task": "agent",
    "tool_latency_s": 1.5,
    "steps": N + M,
    "prompts_per_step": 6,
    "group_size": 4,
    "num_engines": 2,
    "num_workers": 2,
    "worker_capacity": 3,
    "checkpoint_every": N,
    "eval_every": 0,
    "seed": 11,
}


def _events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line torn by SIGKILL
    return out


def _consumed(events: list[dict]) -> list[tuple[int, int, int]]:
    return [
        (e["data"]["step"], gid, ep)
        for e in events
        if e["type"] == "train"
        for gid, ep in zip(e["data"]["group_ids"], e["data"]["epochs"])
    ]


def _batch_in_flight(events: list[dict], proc: subprocess.Popen) -> dict | None:
    """The first event proving batch N+1 in flight: a `sampler` event after the checkpoint at N whose group count
    passed the one reported at step N (between batches nothing is handed out: no prefetch at max_staleness 0,
    and the checkpoint quiesces), while no rollout/train event of step N+1 exists. Fails if the run got past it.
    The heartbeat emits that event when the loop has been silent for 2 s, i.e. inside the batch."""
    assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before batch {N + 1} was seen in flight"
    assert not any(e["type"] in ("rollout", "train") and e["data"]["step"] > N for e in events), (
        f"batch {N + 1} completed before it was seen in flight"
    )
    at = next((i for i, e in enumerate(events) if e["type"] == "checkpoint" and e["data"]["step"] == N), None)
    if at is None:
        return None
    reported = [e["data"]["group_count"] for e in events[:at] if e["type"] == "sampler"][-1]
    return next((e for e in events[at + 1 :] if e["type"] == "sampler" and e["data"]["group_count"] > reported), None)


def _start(tmp: Path, name: str, ray_address: str, *extra: str) -> tuple[subprocess.Popen, Path]:
    config = tmp / "config.json"
    config.write_text(json.dumps(CONFIG))
    events = tmp / f"{name}.jsonl"
    env = {**os.environ, "RAY_ADDRESS": ray_address, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    # Output to files, not pipes: nobody reads a pipe while two runs go on at once, and a full one blocks.
    log = open(tmp / f"{name}-{len(list(tmp.glob('*.log')))}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--config", str(config), "--events", str(events), *extra],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    proc.log_path = Path(log.name)  # type: ignore[attr-defined]
    return proc, events


def _finish(proc: subprocess.Popen, timeout: float = 240) -> None:
    proc.wait(timeout=timeout)
    assert proc.returncode == 0, proc.log_path.read_text()[-3000:]  # type: ignore[attr-defined]


def test_killed_during_an_in_flight_batch_then_resumed_consumes_exactly_the_same_groups(ray_cluster, tmp_path):
    ckpt = tmp_path / "ckpt"
    # The uninterrupted run and the one to be killed run side by side (they share nothing but the cluster).
    straight, straight_events = _start(tmp_path, "straight", ray_cluster.address)
    killed, events = _start(tmp_path, "resumed", ray_cluster.address, "--checkpoint-dir", str(ckpt))
    in_flight = wait_until(
        lambda: _batch_in_flight(_events(events), killed),
        timeout=240,
        what=f"batch {N + 1} to be in flight",
        interval=0.02,
    )
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    _finish(straight)
    before = _events(events)
    # The kill landed while batch N+1 was in flight: it had started (groups handed out after the checkpoint at
    # N) and was not complete (its rollout event comes when it is; the sink flushes every line).
    assert not any(e["type"] in ("rollout", "train") and e["data"]["step"] > N for e in before), "killed too late"
    print(f"killed in batch {N + 1}: group count {in_flight['data']['group_count']}, last event {before[-1]['type']}")

    resumed, _ = _start(tmp_path, "resumed", ray_cluster.address, "--checkpoint-dir", str(ckpt), "--resume")
    _finish(resumed)

    expected = _consumed(_events(straight_events))
    got = _consumed(_events(events))
    assert [s for s, _, _ in expected][-1] == N + M
    assert got == expected  # same group ids, epochs and steps, in the same order
    ids = [gid for _, gid, _ in got]
    assert len(ids) == len(set(ids))  # nothing seen twice
    after = _events(events)[len(before) :]
    gates = [(e["data"]["state"], e["data"]["version"]) for e in after if e["type"] == "gate"]
    assert gates[:2] == [("sealed", 0), ("open", N)]  # engines start closed until the restored weights are in
    versions = [e["data"]["version"] for e in after if e["type"] == "version"]
    assert versions == list(range(N, N + M + 1))  # restored N is published, then N+1..N+M
    straight_rewards = [e["data"]["reward_mean"] for e in _events(straight_events) if e["type"] == "train"]
    assert [e["data"]["reward_mean"] for e in after if e["type"] == "train"] == straight_rewards[N:]
