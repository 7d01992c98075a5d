"""Reconcile against the real Ray job API: outcomes map to run statuses, a vanished job fails its run with a
reason and frees its slot, a starting run whose job already runs is re-attached (not relaunched)."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone
from ray.job_submission import JobDetails, JobStatus, JobSubmissionClient

from runs.execution.reconcile import job_outcome, runs_reconcile
from runs.models import Run, RunStatus, Slot, SlotState

pytestmark = pytest.mark.django_db(transaction=True)


def _details(status: JobStatus, message: str = "") -> JobDetails:
    return JobDetails(type="SUBMISSION", submission_id="x-1-0", entrypoint="python", status=status, message=message)


@pytest.mark.parametrize(
    "run_status,job_status,expected",
    [
        (RunStatus.RUNNING, JobStatus.SUCCEEDED, RunStatus.SUCCEEDED),
        (RunStatus.RUNNING, JobStatus.FAILED, RunStatus.FAILED),
        (RunStatus.RUNNING, JobStatus.STOPPED, RunStatus.FAILED),
        (RunStatus.STOPPING, JobStatus.STOPPED, RunStatus.CANCELLED),
        (RunStatus.STOPPING, JobStatus.FAILED, RunStatus.CANCELLED),
        (RunStatus.STOPPING, JobStatus.SUCCEEDED, RunStatus.SUCCEEDED),
        (RunStatus.RUNNING, JobStatus.RUNNING, None),
        (RunStatus.STARTING, JobStatus.PENDING, None),
    ],
)
def test_job_outcome_maps_ray_states(run_status, job_status, expected):
    run = Run(status=run_status, ray_submission_id="x-1-0", error="cancel requested by bob")
    outcome = job_outcome(run, _details(job_status, "Job entrypoint command failed with exit code 1"))
    assert (outcome[0] if outcome else None) == expected
    if expected == RunStatus.FAILED and job_status == JobStatus.FAILED:
        assert "exit code 1" in outcome[1] and "x-1-0" in outcome[1]


def _active_run(user, *, status: str, submission_id: str) -> Run:
    now = timezone.now()
    run = Run.objects.create(
        name="r",
        origin="api",
        run_class="app",
        kind="rl_train",
        owner=user,
        status=status,
        granted_at=now,
        started_at=now,
        heartbeat_at=now,
        ray_submission_id=submission_id,
    )
    Slot.objects.create(run=run, run_class="app", state=SlotState.HELD, requested_at=now, granted_at=now)
    return run


def test_vanished_job_fails_the_run_and_frees_its_slot(ray_settings, django_user_model, submission_prefix):
    user = django_user_model.objects.create_user(username="v")
    run = _active_run(user, status=RunStatus.RUNNING, submission_id="")
    run.ray_submission_id = f"{submission_prefix}-{run.pk}-0"  # never submitted: Ray does not know it
    run.save(update_fields=["ray_submission_id"])

    started = time.monotonic()
    assert runs_reconcile() == {run.pk: "vanished"}
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "vanished" in run.error and run.ray_submission_id in run.error
    assert not Slot.objects.filter(run=run).exists()
    assert time.monotonic() - started < 10


def test_starting_run_with_a_running_job_is_reattached(ray_settings, django_user_model, submission_prefix):
    ray_cluster = ray_settings
    user = django_user_model.objects.create_user(username="w")
    run = _active_run(user, status=RunStatus.STARTING, submission_id="")
    sid = f"{submission_prefix}-{run.pk}-0"
    # It posted (a run without a placement group, whose move at its first post was lost).
    Run.objects.filter(pk=run.pk).update(ray_submission_id=sid)
    client = JobSubmissionClient(ray_cluster.dashboard_url)
    client.submit_job(entrypoint="sleep 60", submission_id=sid, metadata={"platform_run": str(run.pk)})
    try:
        deadline = time.monotonic() + 60
        while client.get_job_status(sid) != JobStatus.RUNNING:
            assert time.monotonic() < deadline, "job did not start"
            time.sleep(0.3)
        assert runs_reconcile() == {run.pk: "reattached"}
        run.refresh_from_db()
        assert run.status == RunStatus.RUNNING
        jobs = [j for j in client.list_jobs() if (j.metadata or {}).get("platform_run") == str(run.pk)]
        assert len(jobs) == 1  # re-attached, not relaunched

        # Ray reports the job's end; the next reconcile finishes the run with the job's message.
        client.stop_job(sid)
        deadline = time.monotonic() + 30
        while not client.get_job_status(sid).is_terminal():
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert runs_reconcile() == {run.pk: RunStatus.FAILED}
        run.refresh_from_db()
        assert run.error == f"Ray job {sid} was stopped outside the platform"
        assert not Slot.objects.filter(run=run).exists()
    finally:
        client.stop_job(sid)


def test_vanished_job_of_an_auto_resume_run_is_resumed(ray_settings, django_user_model, submission_prefix, monkeypatch):
    from config.celery_app import app as celery_app

    monkeypatch.setattr(celery_app.conf, "task_default_queue", f"{submission_prefix}-unit")  # no worker here
    run = _active_run(django_user_model.objects.create_user(username="a"), status=RunStatus.RUNNING, submission_id="")
    Run.objects.filter(pk=run.pk).update(auto_resume=True, ray_submission_id=f"{submission_prefix}-{run.pk}-0")

    assert runs_reconcile() == {run.pk: "vanished"}
    run.refresh_from_db()
    # Failed, then re-queued by the platform as attempt 1 (and granted again); it reported no checkpoint, so it
    # starts over from step 0 (no --resume).
    assert run.status in (RunStatus.QUEUED, RunStatus.STARTING)
    assert (run.attempt, run.resume_requested, run.error) == (1, False, "")
    statuses = [e.data["status"] for e in run.events.filter(type="status").order_by("seq")]
    assert statuses[:2] == ["failed", "queued"]
