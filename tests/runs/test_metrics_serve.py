"""`manage.py metrics_serve`: the metrics on a port of their own, served by the real command in its own process
from the test database. No token is asked there (the port is the boundary), the exposition passes promtool, and
a run submitted after the server started shows up in its next scrape."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from runs.models import RunStatus
from tests.processes import committed_database_url, die_with_parent
from tests.realtime.servers import REPO_ROOT, free_port, server_env, stop, wait_port
from tests.runs.test_metrics import TOKEN, metrics_env, pending_of, promtool_check, samples  # noqa: F401 (fixture)
from tests.runs.test_services import submit


@pytest.fixture
def metrics_port(transactional_db, redis_url, metrics_env):
    database_url = committed_database_url("the metrics_serve tests")
    env = server_env(
        database_url=database_url,
        redis_url=redis_url,
        prefix="metrics-serve",
        METRICS_REDIS_PREFIX=metrics_env,
        METRICS_TOKEN=TOKEN,
        METRICS_PUBLIC="0",
    )
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="metrics-serve-", suffix=".log")[1])
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "metrics_serve", "--addr", "127.0.0.1", "--port", str(port)],
        cwd=REPO_ROOT,
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )
    try:
        wait_port(port, proc, log)
        yield port
    finally:
        stop(proc)
        log.unlink(missing_ok=True)


def fetch(port: int, path: str = "/metrics") -> tuple[int, str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        return response.status, response.headers["Content-Type"], response.read().decode()


def test_metrics_serve_answers_without_a_token_and_follows_the_queue(metrics_port, user, handoffs):
    status, content_type, text = fetch(metrics_port)
    assert status == 200 and content_type.startswith("text/plain; version=")
    promtool_check(text)
    assert pending_of(samples(text), "interactive") == 0

    from runs.scheduling.concurrency import settings_update

    settings_update(changes={"max_total": 1}, partial=True, by=None)
    runs = [submit(user, origin="dashboard", name=f"s{i}") for i in range(3)]
    for run in runs:
        run.refresh_from_db()
    assert sorted(r.status for r in runs) == [RunStatus.QUEUED, RunStatus.QUEUED, RunStatus.STARTING]
    _, _, text = fetch(metrics_port)
    promtool_check(text)
    got = samples(text)
    assert pending_of(got, "interactive") == 2
    assert got[("rlcp_slots_in_use", frozenset({("run_class", "interactive")}))] == 1
