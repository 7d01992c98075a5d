"""What the platform's stop and start do to the runs their jobs belonged to (runs/execution/restart.py), on the
real database with Ray's view of each job given as Ray's own JobDetails: a starting or running run goes back to
the queue at its old place (the slot's requested_at), a new attempt that resumes from its checkpoint when it
has one; an ended job still finishes its run; at a start a job Ray still runs is left to run, and one stopped
by someone else still fails its run, as the tick would do."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from ray.job_submission import JobDetails, JobStatus

from runs.core.events import run_events_record
from runs.core.lifecycle import TRANSITIONS, run_transition
from runs.execution.ray import submission_id_for
from runs.execution.restart import UNREAD, runs_interrupted
from runs.models import Run, RunEvent, RunStatus, Slot, SlotState
from runs.scheduling.concurrency import settings_update
from tests.runs.test_services import submit

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]


def _details(status: JobStatus) -> JobDetails:
    return JobDetails(type="SUBMISSION", submission_id="x", entrypoint="python", status=status, message="")


def running(user, *, name: str, checkpoint: int | None = None) -> Run:
    """A granted run whose job was launched and reported (its current attempt's submission id is recorded)."""
    run = submit(user, name=name)
    assert run.status == RunStatus.STARTING
    run_transition(run=run, status=RunStatus.RUNNING)
    Run.objects.filter(pk=run.pk).update(ray_submission_id=submission_id_for(run), heartbeat_at=timezone.now())
    if checkpoint is not None:
        run_events_record(
            run=run,
            source=f"attempt-{run.attempt}",
            events=[{"seq": 1, "ts": timezone.now(), "type": "checkpoint", "data": {"step": checkpoint}}],
        )
        Run.objects.filter(pk=run.pk).update(summary={"checkpoint": {"step": checkpoint}})
    return Run.objects.get(pk=run.pk)


def history(run: Run) -> list[str]:
    return [e.data["status"] for e in RunEvent.objects.filter(run=run, type="status", source="platform")]


def test_a_stop_requeues_at_the_old_place_to_resume_and_grants_nothing(
    user, handoffs, django_capture_on_commit_callbacks
):
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    held = running(user, name="held", checkpoint=5)
    waiting = submit(user, name="waiting")
    place = Slot.objects.get(run=held).requested_at
    assert waiting.status == RunStatus.QUEUED
    handoffs.dispatched.clear()

    with django_capture_on_commit_callbacks(execute=True):
        done = runs_interrupted(stopping=True, observed={held.pk: _details(JobStatus.STOPPED)})
    assert done == {held.pk: "requeued"}
    held.refresh_from_db()
    assert held.status == RunStatus.QUEUED and held.resume_requested and held.attempt == 1
    assert "the platform stopped" in held.pending_detail
    slot = Slot.objects.get(run=held)
    assert (slot.state, slot.requested_at, slot.granted_at) == (SlotState.WAITING, place, None)
    # Nothing granted while the platform goes down: the waiting run stays queued behind it.
    assert Run.objects.get(pk=waiting.pk).status == RunStatus.QUEUED and handoffs.dispatched == []
    statuses = history(held)
    assert statuses == ["queued", "starting", "running", "queued"]
    assert all(b in TRANSITIONS[a] for a, b in zip(statuses, statuses[1:]))

    # The next start: its job is unknown to the new cluster (already requeued: not looked at); the freed place
    # goes to the requeued run first (its original requested_at), not to the run that waited behind it.
    with django_capture_on_commit_callbacks(execute=True):
        assert runs_interrupted(stopping=False, observed={}) == {}
    assert Run.objects.get(pk=held.pk).status == RunStatus.STARTING
    assert Run.objects.get(pk=waiting.pk).status == RunStatus.QUEUED
    assert handoffs.dispatched == [held.pk]


def test_a_start_requeues_runs_whose_jobs_the_crash_took(user, handoffs):
    settings_update(changes={"max_total": 3, "interactive_reserve": 0}, partial=True, by=None)
    saved = running(user, name="saved", checkpoint=10)
    fresh = running(user, name="fresh")  # no checkpoint yet: starts over from step 0
    never_launched = submit(user, name="never-launched")  # granted, its launch lost with the platform
    assert never_launched.status == RunStatus.STARTING and not never_launched.ray_submission_id

    done = runs_interrupted(stopping=False, observed={saved.pk: None, fresh.pk: None})
    assert done == {saved.pk: "requeued", fresh.pk: "requeued", never_launched.pk: "requeued"}
    for run, resumes in ((saved, True), (fresh, False), (never_launched, False)):
        run.refresh_from_db()
        assert run.status == RunStatus.STARTING and run.attempt == 1, run  # granted again at once
        assert run.resume_requested is resumes
        assert "the platform restarted" in run.pending_detail


def test_jobs_that_ended_or_still_run_are_not_requeued(user, handoffs):
    settings_update(changes={"max_total": 4, "interactive_reserve": 0}, partial=True, by=None)
    done_job, adopted, stopped_elsewhere = (running(user, name=n) for n in ("done", "adopted", "stopped"))
    observed = {
        done_job.pk: _details(JobStatus.SUCCEEDED),
        adopted.pk: _details(JobStatus.RUNNING),
        stopped_elsewhere.pk: _details(JobStatus.STOPPED),
    }
    assert runs_interrupted(stopping=False, observed=observed) == {
        done_job.pk: RunStatus.SUCCEEDED,
        adopted.pk: "unchanged",
        stopped_elsewhere.pk: RunStatus.FAILED,
    }
    assert Run.objects.get(pk=adopted.pk).status == RunStatus.RUNNING
    assert "stopped outside the platform" in Run.objects.get(pk=stopped_elsewhere.pk).error


def test_a_job_still_running_at_a_stop_is_requeued_and_a_finished_one_finishes(user, handoffs):
    settings_update(changes={"max_total": 4, "interactive_reserve": 0}, partial=True, by=None)
    slow, finished, broken = (running(user, name=n, checkpoint=3) for n in ("slow", "finished", "broken"))
    observed = {
        slow.pk: _details(JobStatus.RUNNING),  # did not stop in time: Ray goes next, and the job with it
        finished.pk: _details(JobStatus.SUCCEEDED),
        broken.pk: _details(JobStatus.FAILED),
    }
    assert runs_interrupted(stopping=True, observed=observed) == {
        slow.pk: "requeued",
        finished.pk: RunStatus.SUCCEEDED,
        broken.pk: RunStatus.FAILED,
    }


def test_ray_not_answering_changes_nothing(user, handoffs, settings):
    run = running(user, name="r")
    settings.RAY_ADDRESS = "http://127.0.0.1:9"  # nothing listens: the job API does not answer
    assert runs_interrupted(stopping=False) is None
    assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING


def test_a_job_ray_did_not_answer_for_leaves_its_run_and_the_command_fails(user, handoffs):
    """At a start, a launched run whose job Ray did not answer for (missing from `observed`) is left as it is and
    reported, and `manage.py runs_interrupted --starting` exits 1, so platform/up.py tries again before the tick
    (which would fail the run as lost with the old cluster's node) starts."""
    settings_update(changes={"max_total": 4, "interactive_reserve": 0}, partial=True, by=None)
    unread, gone = running(user, name="unread"), running(user, name="gone")
    assert runs_interrupted(stopping=False, observed={gone.pk: None}) == {unread.pk: UNREAD, gone.pk: "requeued"}
    assert Run.objects.get(pk=unread.pk).status == RunStatus.RUNNING
    assert Run.objects.get(pk=gone.pk).status in (RunStatus.QUEUED, RunStatus.STARTING)
    with mock.patch("runs.management.commands.runs_interrupted.runs_interrupted", return_value={unread.pk: UNREAD}):
        with pytest.raises(CommandError, match=rf"runs \[{unread.pk}\] could not be read"):
            call_command("runs_interrupted", "--starting")


def test_the_start_tries_the_requeue_again_until_every_job_is_read_or_the_deadline():
    sys.path.insert(0, str(REPO / "platform"))
    try:
        from stopping import RETRY_PAUSE_S, runs_interrupted_at_start  # a script directory, not a package
    finally:
        sys.path.remove(str(REPO / "platform"))
    now = [0.0]
    calls: list[float] = []

    def attempt(outcomes):
        def run(env, when, timeout):
            assert when == "starting" and timeout > 0
            calls.append(timeout)
            return outcomes.pop(0)

        return run

    def sleep(s):
        now[0] += s

    ok = runs_interrupted_at_start({}, 60, attempt([False, False, True]), lambda: now[0], sleep)
    assert ok and len(calls) == 3 and calls[0] == 60 and calls[2] == 60 - 2 * RETRY_PAUSE_S
    now[0], calls[:] = 0.0, []
    assert not runs_interrupted_at_start({}, 5, attempt([False] * 10), lambda: now[0], sleep)
    assert len(calls) == 3 and now[0] < 5  # 0, 2, 4 s: never past its deadline
