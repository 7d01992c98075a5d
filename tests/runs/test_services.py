"""Run lifecycle services against the real database: grants on submit/release/settings, cancel, resume,
heartbeat reclaim, time limits, status events, and after-commit hand-off to Celery."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs.core.cancel import run_cancel
from runs.core.lifecycle import run_finish, run_transition
from runs.errors import InvalidInput, InvalidTransition
from runs.execution.submit import run_submit
from runs.execution.sweeps import runs_enforce_time_limits, runs_reclaim_stale
from runs.models import Run, RunEvent, RunStatus, Slot, SlotState
from runs.scheduling.concurrency import settings_update
from runs.scheduling.enqueue import run_resume
from runs.slots import store
from runs.telemetry.ingest import run_events_ingest, run_for_ingest
from tests.runs.helpers import TEST_KIND

pytestmark = pytest.mark.django_db


def submit(owner, origin="api", name="r", **kw):
    return run_submit(owner=owner, name=name, origin=origin, kind=TEST_KIND, config={"steps": 1}, **kw)


def statuses(run):
    return [(e.data["previous"], e.data["status"]) for e in RunEvent.objects.filter(run=run, type="status")]


def test_submit_grants_and_dispatches_after_commit(user, handoffs, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        run = submit(user)
    assert run.status == RunStatus.STARTING and run.granted_at is not None
    assert Slot.objects.get(run=run).state == SlotState.HELD
    assert handoffs.dispatched == [run.pk]
    assert statuses(run) == [(None, "queued"), ("queued", "starting")]
    assert list(RunEvent.objects.filter(run=run).values_list("seq", flat=True)) == [1, 2]


def test_nothing_dispatched_before_commit(user, handoffs, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        submit(user)
    assert handoffs.dispatched == [] and callbacks


def test_release_grants_next_in_same_transaction(user, handoffs, django_capture_on_commit_callbacks):
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    with django_capture_on_commit_callbacks(execute=True):
        first, second = submit(user, name="a"), submit(user, name="b")
    assert second.status == RunStatus.QUEUED and handoffs.dispatched == [first.pk]
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        run_finish(run=first, status=RunStatus.SUCCEEDED)
    assert len([c for c in callbacks]) >= 1
    second.refresh_from_db()
    assert second.status == RunStatus.STARTING and handoffs.dispatched == [first.pk, second.pk]
    assert not Slot.objects.filter(run=first).exists()
    # finishing again is a no-op
    assert run_finish(run=first, status=RunStatus.FAILED).status == RunStatus.SUCCEEDED


def test_unknown_origin_kind_and_bad_config(user):
    for kwargs, field in [
        ({"origin": "cli"}, "origin"),
        ({"kind": "nope"}, "kind"),
        ({"config": {"steps": "x"}}, "config.steps"),
        ({"config": {"lr": 1}}, "config.lr"),
        ({"name": ""}, "name"),
        ({"time_limit_seconds": 0}, "time_limit_seconds"),
    ]:
        args = {"owner": user, "name": "r", "origin": "api", "kind": TEST_KIND, "config": {"steps": 1}} | kwargs
        with pytest.raises(InvalidInput) as info:
            run_submit(**args)
        assert info.value.field == field
    assert not Run.objects.exists()


def test_cancel_queued_and_active(user, handoffs, django_capture_on_commit_callbacks):
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    active, queued = submit(user), submit(user)
    cancelled = run_cancel(run=queued, by=user)
    assert cancelled.status == RunStatus.CANCELLED and not Slot.objects.filter(run=queued).exists()
    with django_capture_on_commit_callbacks(execute=True):
        stopping = run_cancel(run=active, by=user)
    assert stopping.status == RunStatus.STOPPING and handoffs.stopped == [active.pk]
    assert Slot.objects.get(run=active).state == SlotState.HELD  # held until the job really ends
    with pytest.raises(InvalidTransition):
        run_cancel(run=queued, by=user)


def test_resume_requeues_failed_run(user, handoffs):
    run = submit(user)
    # The job reported a checkpoint (the summary ingest keeps), so the resume continues from it.
    Run.objects.filter(pk=run.pk).update(summary={"checkpoint": {"step": 1, "state": "saved"}})
    run_finish(run=run, status=RunStatus.FAILED, error="boom")
    resumed = run_resume(run=run, by=user)
    assert resumed.status == RunStatus.STARTING and resumed.resume_requested and resumed.error == ""
    assert statuses(run)[-2:] == [("failed", "queued"), ("queued", "starting")]
    with pytest.raises(InvalidTransition):
        run_resume(run=resumed, by=user)


def test_stale_heartbeat_is_reclaimed_and_next_granted(user, settings, handoffs):
    settings.SLOTS_HEARTBEAT_TIMEOUT_SECONDS = 30
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    run, waiting = submit(user), submit(user)
    run_transition(run=run, status=RunStatus.RUNNING)
    # The real heartbeat path: the job's (here empty) event post, authenticated with its ingest token.
    assert run_events_ingest(run=run_for_ingest(run_id=run.pk, token=run.ingest_token), payload=[]).status == "running"
    now = timezone.now()
    assert runs_reclaim_stale(now=now + timedelta(seconds=10), jobs={}) == []
    assert runs_reclaim_stale(now=now + timedelta(seconds=31), jobs={}) == [run.pk]
    run.refresh_from_db()
    waiting.refresh_from_db()
    assert run.status == RunStatus.FAILED and "heartbeat lost" in run.error
    assert waiting.status == RunStatus.STARTING
    with pytest.raises(InvalidTransition):  # a reclaimed run takes no more heartbeats: its job is told to stop
        run_for_ingest(run_id=run.pk, token=run.ingest_token)


def test_time_limit_counts_from_grant(user, handoffs):
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    first = submit(user)
    limited = submit(user, time_limit_seconds=60)
    Run.objects.filter(pk=limited.pk).update(created_at=timezone.now() - timedelta(hours=1))  # long queue time
    run_finish(run=first, status=RunStatus.SUCCEEDED)
    limited.refresh_from_db()
    granted = limited.granted_at
    assert runs_enforce_time_limits(now=granted + timedelta(seconds=59)) == []
    assert runs_enforce_time_limits(now=granted + timedelta(seconds=61)) == [limited.pk]
    limited.refresh_from_db()
    assert limited.status == RunStatus.FAILED and "time limit of 60 s" in limited.error


def test_settings_change_grants_and_lowering_never_preempts(user, handoffs):
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    runs = [submit(user, origin="dashboard") for _ in range(3)]
    assert [r.status for r in runs] == ["starting", "queued", "queued"]
    settings_update(changes={"max_total": 3}, partial=True, by=None)
    assert Slot.objects.filter(state=SlotState.HELD).count() == 3
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    assert Slot.objects.filter(state=SlotState.HELD).count() == 3  # lowered: nobody preempted
    assert set(Run.objects.values_list("status", flat=True)) == {"starting"}


def test_settings_update_validation_and_merge(staff):
    with pytest.raises(InvalidInput) as info:
        settings_update(changes={"classes": {"app": {"limit": True}}}, partial=True, by=staff)
    assert info.value.field == "classes.app.limit"
    settings_update(changes={"max_total": 10}, partial=True, by=staff)
    settings_update(changes={"classes": {"app": {"limit": 2}}}, partial=True, by=staff)
    assert store.policy_stored_raw() == {"max_total": 10, "classes": {"app": {"limit": 2}}}
    with pytest.raises(InvalidInput, match="must be below max_total"):
        settings_update(changes={"interactive_reserve": 10}, partial=True, by=staff)
    settings_update(changes={"interactive_reserve": 1}, partial=False, by=staff)
    assert store.policy_stored_raw() == {"interactive_reserve": 1, "classes": {}}


def test_policy_cache_sees_changes_within_ttl(settings, staff):
    import time

    settings.SLOTS_POLICY_CACHE_SECONDS = 0.2
    store.policy_forget()
    assert store.policy_load().max_total == 4
    from runs.models import ConcurrencySettings

    ConcurrencySettings.objects.create(raw={"max_total": 9})  # as if written by another process
    time.sleep(0.25)
    assert store.policy_load().max_total == 9
