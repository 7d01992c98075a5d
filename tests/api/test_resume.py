"""Resume (`POST /api/runs/<id>/resume/`): a run without a checkpoint is refused (409 `no_checkpoint`) unless the
body says `{"from_scratch": true}`, which starts it over from step 0 (no `--resume`); a run with a checkpoint
continues from it (`--resume`). Checkpoints are what the job reported through the real ingest endpoint.
Auto-resume (the platform's) starts a run without a checkpoint over, and resumes one with a checkpoint."""

from __future__ import annotations

import time

import pytest

from runs.core.checkpoints import run_checkpoint_step
from runs.core.lifecycle import run_finish
from runs.execution.jobs import rl_train_job
from runs.models import Run, RunStatus
from runs.outbox.drain import effects_drain
from runs.outbox.models import Effect
from tests.api.clients import client_for, post_run

pytestmark = pytest.mark.django_db


def report(client, run: Run, *checkpoints: dict) -> None:
    """The job's checkpoint events, posted as the job posts them (per-run token, emitter seq)."""
    events = [
        {"seq": i + 1, "ts": time.time(), "type": "checkpoint", "data": data} for i, data in enumerate(checkpoints)
    ]
    answer = client.post(
        f"/api/runs/{run.pk}/ingest/", events, format="json", HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}"
    )
    assert answer.status_code == 200, answer.content


def failed_run(user, client, *checkpoints: dict) -> Run:
    run = Run.objects.get(pk=post_run(client).json()["id"])
    if checkpoints:
        report(client_for(), run, *checkpoints)
    return run_finish(run=Run.objects.get(pk=run.pk), status=RunStatus.FAILED, error="boom")


SAVED = {"step": 4, "version": 4, "path": "/ckpt/step-000004", "reason": "periodic", "state": "saved"}
FAILED = {"step": 6, "version": 6, "reason": "periodic", "state": "failed", "error": "quiesce timed out"}


def test_resume_without_a_checkpoint_is_409_no_checkpoint(user, handoffs):
    client = client_for(user)
    run = failed_run(user, client)
    answer = client.post(f"/api/runs/{run.pk}/resume/")
    assert answer.status_code == 409
    body = answer.json()
    assert body["code"] == "no_checkpoint" and body["field"] == "from_scratch", body
    assert "from_scratch" in body["detail"]
    run.refresh_from_db()
    assert (run.status, run.attempt) == (RunStatus.FAILED, 0)  # nothing changed
    # The same with an explicit false, and with only a failed checkpoint reported.
    assert client.post(f"/api/runs/{run.pk}/resume/", {"from_scratch": False}, format="json").status_code == 409
    only_failed = failed_run(user, client, FAILED)
    assert run_checkpoint_step(only_failed) is None
    assert client.post(f"/api/runs/{only_failed.pk}/resume/").json()["code"] == "no_checkpoint"


def test_from_scratch_starts_over_from_step_0(user, handoffs):
    client = client_for(user)
    run = failed_run(user, client)
    answer = client.post(f"/api/runs/{run.pk}/resume/", {"from_scratch": True}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] in ("queued", "starting")
    run.refresh_from_db()
    assert (run.attempt, run.resume_requested) == (1, False)
    assert "--resume" not in rl_train_job(run).entrypoint


def test_from_scratch_must_be_a_json_boolean(user, handoffs):
    client = client_for(user)
    run = failed_run(user, client)
    for bad in ("true", 1, None, [True]):
        answer = client.post(f"/api/runs/{run.pk}/resume/", {"from_scratch": bad}, format="json")
        assert answer.status_code == 400 and answer.json()["field"] == "from_scratch", (bad, answer.content)
    assert Run.objects.get(pk=run.pk).status == RunStatus.FAILED


def test_resume_with_a_checkpoint_continues_from_it(user, handoffs):
    client = client_for(user)
    # A saved checkpoint, then a failed one: the saved one is what a resume continues from.
    run = failed_run(user, client, SAVED, FAILED)
    assert run_checkpoint_step(run) == 4
    answer = client.post(f"/api/runs/{run.pk}/resume/")
    assert answer.status_code == 200, answer.content
    run.refresh_from_db()
    assert (run.attempt, run.resume_requested) == (1, True)
    assert "--resume" in rl_train_job(run).entrypoint


def test_a_restored_checkpoint_counts_and_so_does_an_older_jobs_report_without_state(user, handoffs):
    client = client_for(user)
    restored = failed_run(user, client, {"step": 9, "version": 9, "reason": "restored", "path": "/c"})
    older = failed_run(user, client, {"step": 5, "version": 5, "path": "/c/step-000005"})
    assert (run_checkpoint_step(restored), run_checkpoint_step(older)) == (9, 5)


def test_resume_of_a_running_run_is_still_a_status_409(user, handoffs):
    client = client_for(user)
    run_id = post_run(client).json()["id"]
    answer = client.post(f"/api/runs/{run_id}/resume/", {"from_scratch": True}, format="json")
    assert answer.status_code == 409 and answer.json()["field"] == "status" and "code" not in answer.json()


@pytest.mark.parametrize("checkpoint,expected", [(None, False), (SAVED, True)])
def test_auto_resume_starts_over_without_a_checkpoint_and_resumes_with_one(user, handoffs, checkpoint, expected):
    client = client_for(user)
    run = Run.objects.get(pk=post_run(client, auto_resume=True).json()["id"])
    if checkpoint:
        report(client_for(), run, checkpoint)
    run_finish(run=Run.objects.get(pk=run.pk), status=RunStatus.FAILED, error="lost")
    # The follow-ups, stored with the finish, drained by hand: this test's transaction never commits (no kick).
    effects_drain()
    followups = Effect.objects.get(kind="followups", payload__run=run.pk)
    assert (followups.state, followups.outcome) == ("done", "resumed" if expected else "restarted")
    run.refresh_from_db()
    assert run.status in (RunStatus.QUEUED, RunStatus.STARTING)
    assert (run.attempt, run.resume_requested) == (1, expected)


def test_schema_documents_the_body_and_the_409(user):
    schema = client_for(user).get("/api/schema/", {"format": "json"}).json()
    operation = schema["paths"]["/api/runs/{run_id}/resume/"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert "from_scratch" in schema["components"]["schemas"][body]["properties"]
    assert "no_checkpoint" in operation["responses"]["409"]["description"]
    assert "code" in schema["components"]["schemas"]["Error"]["properties"]
