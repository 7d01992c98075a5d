"""Every way a run ends goes through run_finish, so its follow-ups apply whatever ended it: an auto-resume run
failed by heartbeat reclaim, by its time limit, by a launch error, by the launch timeout or by the loss of its
node is resumed (a lost launch is launched again, not failed); and a job's own final event
finishes its run in the ingest request itself (no tick)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runs import tasks
from runs.core.cancel import run_cancel
from runs.core.lifecycle import run_transition
from runs.execution import liveness, ray
from runs.execution.submit import run_submit
from runs.execution.sweeps import runs_enforce_time_limits, runs_reclaim_stale
from runs.models import ClusterNode, Run, RunStatus, Slot
from tests.runs.helpers import TEST_JOB_KIND

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _artifacts(settings, tmp_path):
    settings.RUN_ARTIFACTS_DIR = str(tmp_path)
    settings.RAY_ADDRESS = "http://127.0.0.1:9"  # no Ray here (never the machine's default 8265: maybe someone's)


def submit(user, **kw):
    return run_submit(owner=user, name="r", origin="api", kind=TEST_JOB_KIND, config={}, **kw)


def assert_resumed(run: Run, error: str) -> None:
    run.refresh_from_db()
    # Failed with the reason, then re-queued by the platform as attempt 1 (and granted again): it reported no
    # checkpoint, so it starts over from step 0 (no --resume; tests/api/test_resume.py has the checkpointed case).
    assert run.status in (RunStatus.QUEUED, RunStatus.STARTING), run.status
    assert (run.attempt, run.resume_requested, run.error) == (1, False, "")
    events = [e.data for e in run.events.filter(type="status").order_by("seq")]
    failed = [e for e in events if e["status"] == RunStatus.FAILED]
    assert len(failed) == 1 and error in failed[0]["error"], events
    assert [e["status"] for e in events][-2:] in (["failed", "queued"], ["queued", "starting"])


def test_reclaimed_auto_resume_run_is_resumed(user, handoffs, settings):
    settings.SLOTS_HEARTBEAT_TIMEOUT_SECONDS = 30
    run = submit(user, auto_resume=True)
    run_transition(run=run, status=RunStatus.RUNNING)
    assert runs_reclaim_stale(now=timezone.now() + timedelta(seconds=31), jobs={}) == [run.pk]
    assert_resumed(run, "heartbeat lost")
    assert run.pk in handoffs.stopped  # the platform ended it: its job is asked to stop


def test_timed_out_auto_resume_run_is_resumed(user, handoffs):
    run = submit(user, auto_resume=True, time_limit_seconds=60)
    run.refresh_from_db()
    assert runs_enforce_time_limits(now=run.granted_at + timedelta(seconds=61)) == [run.pk]
    assert_resumed(run, "time limit of 60 s exceeded")


def test_launch_error_of_an_auto_resume_run_is_resumed(user, handoffs, monkeypatch):
    def refuse(run, spec):
        raise RuntimeError("entrypoint refused")

    monkeypatch.setattr(ray, "job_submit", refuse)
    run = submit(user, auto_resume=True)
    assert tasks.dispatch_run(run.pk) == "failed"
    assert_resumed(run, "launch failed: entrypoint refused")


def test_launch_timeout_of_an_auto_resume_run_is_resumed(user, handoffs, settings):
    settings.RUN_LAUNCH_TIMEOUT_SECONDS = 900
    run = submit(user, auto_resume=True)
    run.refresh_from_db()
    done = liveness.runs_starting_check(now=run.granted_at + timedelta(seconds=901), jobs={})
    assert done["launch_timeout"] == [run.pk]
    assert_resumed(run, "launch timeout: not running 901 s after its grant")
    assert run.pk in handoffs.stopped


def test_a_lost_launch_is_launched_again_not_failed(user, handoffs):
    run = submit(user, auto_resume=True)
    run.refresh_from_db()
    done = liveness.runs_starting_check(now=run.granted_at + timedelta(seconds=31), jobs={})
    assert done == {"launch_timeout": [], "requeued": [], "relaunch": [run.pk]}
    run.refresh_from_db()
    assert (run.status, run.attempt) == (RunStatus.STARTING, 0)


def test_node_loss_of_an_auto_resume_run_is_resumed(user, handoffs):
    ClusterNode.objects.create(node_id="n1", address="10.0.0.1", alive=False, total={}, seen_at=timezone.now())
    run = submit(user, auto_resume=True)
    run_transition(run=run, status=RunStatus.RUNNING)
    Slot.objects.filter(run_id=run.pk).update(placement=["n0", "n1"])
    assert liveness.runs_node_loss() == {run.pk: RunStatus.FAILED}
    assert_resumed(run, "node n1 (10.0.0.1) lost")
    assert run.pk in handoffs.stopped


def test_without_auto_resume_a_failed_run_stays_failed(user, handoffs, settings):
    settings.SLOTS_HEARTBEAT_TIMEOUT_SECONDS = 30
    run = submit(user)
    run_transition(run=run, status=RunStatus.RUNNING)
    assert runs_reclaim_stale(now=timezone.now() + timedelta(seconds=31), jobs={}) == [run.pk]
    run.refresh_from_db()
    assert (run.status, run.attempt) == (RunStatus.FAILED, 0)


def test_auto_resume_is_bounded(user, handoffs, settings):
    settings.SLOTS_HEARTBEAT_TIMEOUT_SECONDS = 30
    settings.RUN_AUTO_RESUME_MAX = 2
    run = submit(user, auto_resume=True)
    for _ in range(3):
        run.refresh_from_db()
        if run.status == RunStatus.STARTING:
            run_transition(run=run, status=RunStatus.RUNNING)
        runs_reclaim_stale(now=timezone.now() + timedelta(seconds=31), jobs={})
    run.refresh_from_db()
    assert (run.status, run.attempt) == (RunStatus.FAILED, 2)


@pytest.mark.parametrize(
    "final,expected",
    [
        ({"status": "succeeded", "metrics": {}}, RunStatus.SUCCEEDED),
        ({"status": "failed", "error": "ValueError: bad batch"}, RunStatus.FAILED),
    ],
)
def test_terminal_event_finishes_the_run_within_one_ingest_round_trip(user, handoffs, final, expected):
    run = submit(user)
    run_transition(run=run, status=RunStatus.RUNNING)
    events = [
        {"seq": 1, "ts": time.time(), "type": "status", "data": {"status": "running"}},
        {"seq": 2, "ts": time.time(), "type": "status", "data": final},
    ]
    started = time.monotonic()
    response = Client().post(
        f"/api/runs/{run.pk}/ingest/",
        data=events,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.content
    assert response.json()["status"] == expected and elapsed <= 1.0
    run.refresh_from_db()
    assert run.status == expected and run.finished_at is not None
    assert not Slot.objects.filter(run_id=run.pk).exists()  # released: the next run can be granted
    if expected == RunStatus.FAILED:
        assert "ValueError: bad batch" in run.error


def test_a_running_event_does_not_finish_the_run(user, handoffs):
    run = submit(user)
    run_transition(run=run, status=RunStatus.RUNNING)
    response = Client().post(
        f"/api/runs/{run.pk}/ingest/",
        content_type="application/json",
        data=[{"seq": 1, "ts": time.time(), "type": "status", "data": {"status": "running"}}],
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )
    assert response.status_code == 200 and response.json()["status"] == RunStatus.RUNNING


def test_a_stopping_run_waits_for_its_job_to_end(user, handoffs):
    """A cancel ends when Ray says the job stopped (the reconcile), not at the job's `cancelled` event."""
    run = submit(user)
    run_transition(run=run, status=RunStatus.RUNNING)
    run_cancel(run=run, by=user)
    response = Client().post(
        f"/api/runs/{run.pk}/ingest/",
        content_type="application/json",
        data=[{"seq": 1, "ts": time.time(), "type": "status", "data": {"status": "cancelled"}}],
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )
    assert response.status_code == 200 and response.json()["status"] == RunStatus.STOPPING
