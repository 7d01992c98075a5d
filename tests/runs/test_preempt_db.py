"""Preemption against the database (SQLite and PostgreSQL, whichever DATABASE_URL names): the tick's request
under the grant lock (runs/execution/preempt.py), its row, event, stop effect and audit row; the job's end
putting the victim back at the head of its class and granting the waiting run in the same transaction; the
grace period's hard stop; the daily cap; the dry-run's answer; options off changing nothing. Ray is not involved:
the job's end is told the way the reconcile tells it (runs/execution/outcome.py `run_job_finished`); the live
path on real Ray is tests/execution/test_preempt_live.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs.audit.models import AuditEntry
from runs.core.events import PLATFORM_SOURCE, run_events_record
from runs.core.lifecycle import run_finish, run_transition
from runs.execution import preempt, reconcile
from runs.execution.outcome import run_job_finished
from runs.models import Preemption, Run, RunEvent, RunStatus, Slot
from runs.outbox.models import Effect
from runs.scheduling import queue
from runs.scheduling.concurrency import settings_update
from runs.telemetry import ingest
from tests.runs.test_admission_db import nodes, submit

pytestmark = pytest.mark.django_db(transaction=True)  # real commits: effects drain, grants follow releases
ON = {"interactive": {"preempts": True}, "schedule": {"preemptible": True}}


def configure(**extra) -> None:
    changes = {"max_total": 2, "interactive_reserve": 0, "classes": ON, "preempt_grace_seconds": 60, **extra}
    settings_update(changes=changes, partial=True, by=None)


def running(owner, name: str, *, checkpoint: int | None, step: int) -> Run:
    run = submit(owner, name=name, origin="schedule", cpus=1.0)
    assert run.status == RunStatus.STARTING
    run_transition(run=run, status=RunStatus.RUNNING)
    events = [{"type": "train", "ts": timezone.now(), "data": {"step": step}}]
    summary: dict = {"train": {"step": step}}
    if checkpoint is not None:
        data = {"step": checkpoint, "state": "saved"}
        events.append({"type": "checkpoint", "ts": timezone.now(), "data": data})
        summary["checkpoint"] = data
    run_events_record(run=run, source="attempt-1", events=events)
    Run.objects.filter(pk=run.pk).update(summary=summary, ray_submission_id=f"job-{run.pk}")
    return Run.objects.get(pk=run.pk)


def fresh(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)


@pytest.fixture
def full(user, handoffs):
    """Two preemptible schedule runs fill both slots (one CPU each on a 2-CPU node); an interactive run waits."""
    nodes(a=(2, 0))
    configure()
    old = running(user, "old", checkpoint=2, step=5)
    new = running(user, "new", checkpoint=9, step=9)  # the most recent checkpoint: the least work lost
    waiting = submit(user, name="interactive", origin="dashboard", cpus=1.0)
    assert waiting.status == RunStatus.QUEUED
    return old, new, waiting, handoffs


def test_exactly_one_victim_then_back_at_the_head_and_the_waiting_run_granted(full):
    old, new, waiting, handoffs = full
    requested_at = Slot.objects.get(run=new).requested_at
    assert preempt.preemptions_request() == [new.pk]
    assert preempt.preemptions_request() == []  # under way: no second victim for the same run
    victim = fresh(new)
    assert (victim.status, victim.preempt_state, victim.preempted_by_id) == (RunStatus.RUNNING, "requested", waiting.pk)
    row = Preemption.objects.get(run=new)
    assert (row.preempted_by_id, row.step_at_request, row.ended_at, row.job) == (waiting.pk, 9, None, f"job-{new.pk}")
    assert (row.deadline_at - row.requested_at).total_seconds() == 60
    asked = RunEvent.objects.get(run=new, type="preempt_requested")
    assert asked.source == PLATFORM_SOURCE and asked.data["by"] == waiting.pk and asked.data["checkpoint_step"] == 9
    assert Effect.objects.filter(kind="stop", key__startswith=f"stop:{new.pk}:").count() == 1
    assert handoffs.stopped == [new.pk]  # the stop effect, drained after the commit: the same stop a cancel uses
    audit = AuditEntry.objects.get(action="run.preempt")
    assert audit.target_id == str(new.pk) and audit.after["preempted_by"] == waiting.pk
    assert (audit.actor_name, audit.actor_user_id, audit.request_id) == ("platform", None, "")  # no one asked
    assert fresh(old).preempt_state == ""

    # The job checkpointed and stopped: Ray reports STOPPED, the reconcile tells it as it tells any job's end.
    run_job_finished(run=fresh(new), status=RunStatus.FAILED, error="Ray job was stopped outside the platform")
    victim = fresh(new)
    assert (victim.status, victim.preempt_state, victim.resume_requested) == (RunStatus.QUEUED, "preempted", True)
    assert victim.attempt == new.attempt + 1 and victim.error == ""
    assert fresh(waiting).status == RunStatus.STARTING  # granted in the same transaction
    slot = Slot.objects.get(run=new)
    assert slot.state == "waiting" and slot.requested_at == requested_at
    assert queue.runs_queue_info(runs=[victim])[victim.pk].position_in_class == 1
    row.refresh_from_db()
    assert (row.outcome, row.checkpoint_step, row.lost_steps) == ("checkpointed", 9, 0)
    done = RunEvent.objects.get(run=new, type="preempted").data
    assert (done["outcome"], done["checkpoint_step"], done["lost_steps"]) == ("checkpointed", 9, 0)
    assert done["by"] == waiting.pk
    requeue = AuditEntry.objects.get(action="run.requeue", target_id=str(new.pk))
    assert requeue.actor_name == "platform" and requeue.actor_user_id is None
    assert (requeue.before["status"], requeue.after["status"]) == ("running", "queued")

    # Granted again once the interactive run ends; its job reports running: `resumed`, from the checkpoint.
    run_transition(run=fresh(waiting), status=RunStatus.RUNNING)
    run_finish(run=fresh(waiting), status=RunStatus.SUCCEEDED)
    assert fresh(new).status == RunStatus.STARTING
    ingest._started(fresh(new), placement=None)
    resumed = RunEvent.objects.get(run=new, type="resumed").data
    assert resumed["from_step"] == 9 and resumed["attempt"] == new.attempt + 1
    assert fresh(new).preempt_state == "resumed" and Preemption.objects.get(run=new).resumed_at is not None


def test_grace_period_passed_stops_it_hard_and_reports_the_work_lost(full):
    old, new, waiting, _ = full
    Run.objects.filter(pk=new.pk).update(summary={"train": {"step": 12}, "checkpoint": {"step": 9, "state": "saved"}})
    assert preempt.preemptions_request() == [new.pk]
    assert preempt.preemptions_overdue(now=timezone.now() + timedelta(seconds=30)) == []  # within its grace
    assert preempt.preemptions_overdue(now=timezone.now() + timedelta(seconds=61)) == [new.pk]
    row = Preemption.objects.get(run=new)
    assert (row.outcome, row.checkpoint_step, row.lost_steps) == ("stopped_hard", 9, 3)
    assert fresh(new).status == RunStatus.QUEUED and fresh(waiting).status == RunStatus.STARTING
    stops = Effect.objects.filter(kind="stop", key__startswith=f"stop:{new.pk}:")
    assert stops.count() == 2 and {e.payload["job"] for e in stops} == {f"job-{new.pk}"}  # the old job, twice
    # The old attempt's job ends later: the reconcile no longer looks at it (not active, its attempt moved on).
    assert new.pk not in {r.pk for r in reconcile.active_runs_with_jobs()}


def test_the_daily_cap_protects_a_run(user, handoffs):
    nodes(a=(1, 0))
    configure(max_total=1, max_preemptions_per_run_per_day=1)
    victim = running(user, "victim", checkpoint=1, step=1)
    first = submit(user, name="i1", origin="dashboard", cpus=1.0)
    assert preempt.preemptions_request() == [victim.pk]
    run_job_finished(run=fresh(victim), status=RunStatus.FAILED, error="stopped")
    run_transition(run=fresh(first), status=RunStatus.RUNNING)
    run_finish(run=fresh(first), status=RunStatus.SUCCEEDED)
    run_transition(run=fresh(victim), status=RunStatus.RUNNING)  # granted again, running
    submit(user, name="i2", origin="dashboard", cpus=1.0)
    assert preempt.preemptions_request() == []  # once today: protected
    assert Preemption.objects.filter(run=victim).count() == 1


def test_a_run_that_ends_first_closes_its_preemption(full):
    old, new, waiting, _ = full
    assert preempt.preemptions_request() == [new.pk]
    run_finish(run=fresh(new), status=RunStatus.SUCCEEDED)  # it finished before it stopped
    assert preempt.preemptions_overdue() == []
    assert Preemption.objects.get(run=new).outcome == "ended" and fresh(new).preempt_state == "ended"
    assert fresh(waiting).status == RunStatus.STARTING  # its release granted the waiting run


def test_dry_run_names_the_run_that_would_be_preempted(full):
    old, new, waiting, _ = full
    Run.objects.filter(pk=waiting.pk).update(status=RunStatus.CANCELLED)
    Slot.objects.filter(run=waiting).delete()
    dry = queue.slot_dry_run(origin="dashboard", resources={"bundles": [{"CPU": 1.0, "memory": 1 << 20}]})
    assert not dry["granted"] and [v["run"] for v in dry["would_preempt"]] == [new.pk]
    assert queue.slot_dry_run(origin="api")["would_preempt"] == []  # app does not preempt


def test_options_off_never_preempt(user, handoffs):
    nodes(a=(2, 0))
    settings_update(changes={"max_total": 2, "interactive_reserve": 0}, partial=True, by=None)
    running(user, "a", checkpoint=1, step=1), running(user, "b", checkpoint=1, step=1)
    submit(user, name="interactive", origin="dashboard", cpus=1.0)
    assert preempt.preemptions_request() == [] and not Preemption.objects.exists()
    assert queue.slot_dry_run(origin="dashboard", resources={"bundles": [{"CPU": 1.0}]})["would_preempt"] == []
