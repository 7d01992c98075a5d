"""Multi-process slot stress: random operations from several processes against one real database
(PostgreSQL: advisory lock; SQLite file: write lock), invariants checked after every step, then a drain
that must grant every waiting run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("stress_worker.py")
PG_BASE = "postgres://postgres@127.0.0.1:5432"
pytestmark = pytest.mark.beside  # databases of its own: in the pytest beside the suite (Makefile)


def run_worker(env: dict[str, str], *args: str, timeout: float = 900) -> dict:
    done = subprocess.run(
        [sys.executable, str(WORKER), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"{args}: rc={done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1])


def stress(database_url: str, *, processes: int, ops_each: int, fair: bool = False) -> None:
    env = dict(os.environ, DATABASE_URL=database_url, SLOTS_POLICY_CACHE_SECONDS="1", LOG_LEVEL="WARNING")
    env["STRESS_FAIR"] = "1" if fair else "0"
    owner = run_worker(env, "setup")["owner"]
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "work", "--ops", str(ops_each), "--seed", str(seed), "--owner", str(owner)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(processes)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)  # the shared 2-core machine can be very busy
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert proc.returncode == 0 and lines, f"worker failed: {out[-3000:]}\n{err[-3000:]}"
        results.append(json.loads(lines[-1]))
    assert all(r["ok"] for r in results), results
    total = sum(sum(r["counts"].values()) for r in results)
    assert [sum(r["counts"].values()) for r in results] == [ops_each] * processes  # every worker did all its ops
    for op in ("submit", "finish", "cancel", "heartbeat_loss", "settings"):
        assert sum(r["counts"].get(op, 0) for r in results) > 0, op
    submitted = sum(r["counts"]["submit"] for r in results)
    drained = run_worker(env, "drain")
    assert drained["ok"] and drained["never_granted"] == 0, drained
    assert drained["runs"] == submitted, drained  # each submit stored exactly one run, whatever raced it
    print(f"{total} ops in {time.monotonic() - started:.1f}s over {processes} processes; drain: {drained}")


@contextmanager
def pg_database(prefix: str) -> Iterator[str]:
    import psycopg

    name = f"{prefix}_{os.getpid()}"
    with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_BASE}/{name}"
    finally:
        with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_stress_postgresql():
    with pg_database("stress_slots") as url:
        stress(url, processes=4, ops_each=int(os.environ.get("STRESS_OPS_EACH", "1250")))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_stress_fair_share_postgresql():
    """The crowd of issue 26: 4 processes submitting for 4 owners while settings turn fair share, per-user
    limits, aging and max wait on and off; class rules, consistency, nothing left grantable, a full drain."""
    with pg_database("stress_fair") as url:
        stress(url, processes=4, ops_each=int(os.environ.get("STRESS_FAIR_OPS_EACH", "500")), fair=True)


@pytest.mark.timeout(600)
def test_no_release_left_ungranted_postgresql(tmp_path):
    """Lost wakeups: releases commit without the grant lock and a releaser that finds the lock taken leaves its
    grant to the holder. 4 processes finish 4 held slots' runs as fast as they can (a busy lock, many failed
    try-locks) while a fifth keeps taking the lock without granting; with no tick running, every freed slot
    must have gone to a waiting run at the end."""
    processes, finishes_each = 4, 60
    with pg_database("race_slots") as url:
        env = dict(os.environ, DATABASE_URL=url, SLOTS_POLICY_CACHE_SECONDS="1", LOG_LEVEL="WARNING")
        owner = run_worker(env, "setup")["owner"]
        queued = processes * finishes_each + 20
        assert run_worker(env, "fill", "--owner", str(owner), "--ops", str(queued))["held"] == 4
        stop = tmp_path / "stop"
        holder = subprocess.Popen(
            [sys.executable, str(WORKER), "holder", "--until", str(stop)], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            procs = [
                subprocess.Popen(
                    [sys.executable, str(WORKER), "finishers", "--ops", str(finishes_each)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for _ in range(processes)
            ]
            busy = 0
            for proc in procs:
                out, err = proc.communicate(timeout=500)
                lines = [line for line in out.splitlines() if line.startswith("{")]
                assert proc.returncode == 0 and lines, f"finisher failed: {out[-3000:]}\n{err[-3000:]}"
                busy += json.loads(lines[-1])["busy"]
            assert busy > 0, "no try-lock ever found the lock taken: the race was not exercised"
        finally:
            stop.touch()  # the holder ends after its current transaction and that transaction's catch-up
            out, _ = holder.communicate(timeout=120)
        assert holder.returncode == 0 and '"ok": true' in out, out
        checked = run_worker(env, "check")
        assert checked["ok"] and checked["held"] == 4, checked
        assert checked["waiting"] == queued - 4 - processes * finishes_each, checked


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_stress_sqlite(tmp_path):
    stress(
        f"sqlite:///{tmp_path / 'stress.sqlite3'}",
        processes=2,
        ops_each=int(os.environ.get("STRESS_OPS_EACH_SQLITE", "2500")),
    )
