"""The Python client and CLI (client/) against a live platform (daphne, a Celery worker, the shared Ray
cluster): submit(wait=True, follow=True) of a 10-step run yields every event seq 1..N exactly once, in order,
while the test drops its websocket twice mid-run; the CLI's exit status is the run's end (0 succeeded,
1 failed, 2 cancelled); a refusal is an ApiError carrying the API's field; a submit retried with its
Idempotency-Key after the web process restarted answers with the first run and creates nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from client import ApiError, Client
from client import follow as follow_module
from runs.models import Run
from tests.execution.conftest import TINY_TRAIN_CONFIG, ray_jobs_of_run

pytestmark = [pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
TEN_STEPS = {**TINY_TRAIN_CONFIG, "steps": 10}


def token_of(api) -> str:
    return api.session.headers["Authorization"].split()[1]


def test_submit_wait_follow_yields_every_event_once_across_dropped_sockets(platform, api, monkeypatch):
    platform.start_worker()
    real_connect = follow_module.connect
    drops: list[str] = []

    @contextmanager
    def dropping(url: str, **kwargs):
        """The real connection; the first two are closed by the client after their third message."""
        with real_connect(url, **kwargs) as socket:
            if len(drops) >= 2:
                yield socket
                return

            def messages():
                for i, raw in enumerate(socket):
                    yield raw
                    if i == 2:
                        drops.append(url.split("?")[1].split("&after=")[-1])
                        socket.close()

            yield messages()

    monkeypatch.setattr(follow_module, "connect", dropping)
    seen: list[dict] = []
    with Client(platform.web_url, token_of(api)) as cp:
        final = cp.submit(name="followed", config=TEN_STEPS, wait=True, follow=True, on_event=seen.append)
        assert final["status"] == "succeeded", final["error"]
        stored = list(cp.events(final["id"]))
    assert len(drops) == 2, drops  # reconnected twice, each time after the last seq it had
    assert [e["seq"] for e in seen] == list(range(1, len(stored) + 1)) == [e["seq"] for e in stored]
    assert seen[-1]["type"] == "status" and seen[-1]["data"]["status"] == "succeeded"
    assert [e["data"]["step"] for e in seen if e["type"] == "train"][-1] == 10


def test_cli_exit_status_is_the_runs_end_and_refusals_name_their_field(platform, api, ray_jobs_ready, tmp_path):
    platform.start_worker()
    env = {**os.environ, "RLCP_URL": platform.web_url, "RLCP_TOKEN": token_of(api), "PYTHONPATH": str(REPO)}
    short, long = tmp_path / "short.json", tmp_path / "long.json"
    short.write_text(json.dumps(TINY_TRAIN_CONFIG))
    long.write_text(json.dumps({**TINY_TRAIN_CONFIG, "steps": 400}))
    cli = [sys.executable, "-m", "client", "--json", "submit", "--wait"]
    done = subprocess.run(
        [*cli, "--config", str(short)], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "succeeded"
    waiting = subprocess.Popen([*cli, "--config", str(long)], env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        run_id = json.loads(waiting.stdout.readline())["id"]
        api.wait_status(run_id, {"running"}, timeout=120)
        api.post(f"/api/runs/{run_id}/cancel/")
        assert waiting.wait(timeout=120) == 2
    finally:
        waiting.kill()
    # Its job stopped outside the platform: the reconcile fails the run, the CLI exits 1.
    failing = subprocess.Popen([*cli, "--config", str(long)], env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        run_id = json.loads(failing.stdout.readline())["id"]
        api.wait_status(run_id, {"running"}, timeout=120)
        from ray.job_submission import JobSubmissionClient

        [job] = ray_jobs_of_run(ray_jobs_ready, run_id)
        JobSubmissionClient(ray_jobs_ready.dashboard_url).stop_job(job.submission_id)
        assert failing.wait(timeout=120) == 1
        assert api.run(run_id)["status"] == "failed"
    finally:
        failing.kill()
    with Client(platform.web_url, token_of(api)) as cp, pytest.raises(ApiError) as refused:
        cp.submit(name="bad", config={"steps": "many"})
    assert refused.value.status == 400 and refused.value.field == "config.steps"


def test_a_submit_retried_after_the_web_restarts_returns_the_first_run(platform, api):
    """The key is kept in the database with the run it made (runs/idempotency/), not in the web process: the
    same POST with the same key, after daphne was killed and started again, is a 200 with the same id."""
    body = {"name": "once", "origin": "api", "kind": "rl_train", "config": TINY_TRAIN_CONFIG}
    headers = {"Idempotency-Key": "restart-7f3a"}
    first = api.session.post(f"{platform.web_url}/api/runs/", json=body, headers=headers, timeout=30)
    assert first.status_code == 201, first.text
    platform.kill("web")
    platform.start_web()
    again = api.session.post(f"{platform.web_url}/api/runs/", json=body, headers=headers, timeout=30)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    assert Run.objects.filter(name="once").count() == 1
