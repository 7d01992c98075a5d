"""Writes of the run lifecycle: submit, grant, transition, finish, cancel, resume, heartbeats, reclaim,
time limits and concurrency settings. Every status change goes through `run_status_change`."""
from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from runs import kinds, limits
from runs.errors import InvalidInput, InvalidTransition
from runs.events import PLATFORM_SOURCE, run_event_to_dict, run_events_record
from runs.models import (
    ACTIVE_STATUSES, FINISHED_STATUSES, ORIGIN_TO_CLASS, ConcurrencySettings, Origin, Run, RunEvent, RunStatus,
)
from runs.notify import slots_notify
from runs.realtime import dashboard_publish, run_event_publish
from runs.slots import pg as slots_pg, store
from runs.slots.grant import Snapshot, grant
from runs.slots.policy import TIME_LIMIT_CEILING, PolicyError, policy_check_merged, policy_merge, policy_validate

NAME_MAX = 200
TIME_LIMIT_MAX = TIME_LIMIT_CEILING
# Allowed moves; anything else is a bug in the caller and raises InvalidTransition.
TRANSITIONS: dict[str, set[str]] = {
    RunStatus.QUEUED: {RunStatus.STARTING, RunStatus.CANCELLED, RunStatus.FAILED},
    RunStatus.STARTING: {RunStatus.RUNNING, RunStatus.STOPPING, *FINISHED_STATUSES},
    RunStatus.RUNNING: {RunStatus.STOPPING, *FINISHED_STATUSES},
    RunStatus.STOPPING: {*FINISHED_STATUSES},
    RunStatus.SUCCEEDED: {RunStatus.QUEUED},
    RunStatus.FAILED: {RunStatus.QUEUED},
    RunStatus.CANCELLED: {RunStatus.QUEUED},
}


def run_status_change(*, run: Run, status: str, error: str | None = None, now: datetime | None = None) -> Run:
    """Move a run to `status`, stamp its timestamps, record a `status` event and tell the dashboard after commit.
    The caller must have loaded `run` with select_for_update in the current transaction; the slot row is the
    caller's business."""
    previous = run.status
    if status not in TRANSITIONS.get(previous, set()):
        raise InvalidTransition(f"cannot move run {run.pk} from {previous} to {status}", field="status")
    now = now or timezone.now()
    run.status = status
    fields = ["status"]
    if status == RunStatus.STARTING:
        run.granted_at, run.started_at, run.heartbeat_at = now, None, None
        fields += ["granted_at", "started_at", "heartbeat_at"]
    elif status == RunStatus.RUNNING:
        run.started_at, run.heartbeat_at = now, now
        fields += ["started_at", "heartbeat_at"]
    elif status in FINISHED_STATUSES:
        run.finished_at = now
        fields.append("finished_at")
    elif status == RunStatus.QUEUED:
        run.granted_at = run.started_at = run.finished_at = run.heartbeat_at = None
        fields += ["granted_at", "started_at", "finished_at", "heartbeat_at"]
    if error is not None:
        run.error = error
        fields.append("error")
    with transaction.atomic(savepoint=False):
        # The caller holds the row lock, so last_seq is current: number the status event here and save it
        # with the status in one UPDATE (two statements instead of run_events_record's four).
        run.last_seq += 1
        run.save(update_fields=[*fields, "last_seq"])
        event = RunEvent.objects.create(run_id=run.pk, seq=run.last_seq, source=PLATFORM_SOURCE, ts=now,
                                        type="status", data={"status": status, "previous": previous,
                                                             "error": run.error})
        run_event_publish(run_event_to_dict(event))
        dashboard_publish({"kind": "run_status", "run": run.pk, "owner": run.owner_id, "name": run.name,
                           "run_class": run.run_class, "status": status, "previous": previous})
    return run


def _grant_pass(*, reason: str, started: float, snapshot: Snapshot | None = None,
                now: datetime | None = None) -> list[int]:
    """Grant under the lock (already held), move granted runs to `starting`, dispatch them after commit.
    PostgreSQL: one snapshot statement (skipped when the release already returned it), `grant()`, one
    statement applying the grants with their events and the NOTIFY."""
    now = now or timezone.now()
    notify = {"reason": reason, "granted": [], "t": started}
    if connection.vendor != "postgresql":
        granted = [d.run_id for d in store.slots_grant_locked(now=now)]
        if granted:
            by_id = Run.objects.select_for_update().in_bulk(granted)
            for run_id in granted:
                run_status_change(run=by_id[run_id], status=RunStatus.STARTING, now=now)
    else:
        decisions = grant(snapshot or slots_pg.snapshot_fetch(), now)
        granted = notify["granted"] = [d.run_id for d in decisions]
        if granted:
            ts = now.timestamp()
            for row in slots_pg.grants_apply(decisions=decisions, now=now, source=PLATFORM_SOURCE, notify=notify):
                run_event_publish({"run": row["id"], "seq": row["last_seq"], "ts": ts, "type": "status",
                                   "data": {"status": RunStatus.STARTING, "previous": RunStatus.QUEUED,
                                            "error": row["error"]}})
                dashboard_publish({"kind": "run_status", "run": row["id"], "owner": row["owner_id"],
                                   "name": row["name"], "run_class": row["run_class"],
                                   "status": RunStatus.STARTING, "previous": RunStatus.QUEUED})
    if granted:
        from runs.tasks import dispatch_run  # late: tasks imports services

        for run_id in granted:
            transaction.on_commit(lambda run_id=run_id: dispatch_run.delay(run_id))
    if connection.vendor != "postgresql" or not granted:
        slots_notify({"reason": reason, "granted": granted, "t": started})  # else sent with the grants
    return granted


def slots_grant(*, reason: str = "tick") -> list[int]:
    """Run one serialized grant pass in its own transaction; returns the granted run ids."""
    started = time.time()
    with transaction.atomic():
        store.slots_lock()
        return _grant_pass(reason=reason, started=started)


def run_submit(
    *, owner: Any, name: str, origin: str, kind: str, config: Any,
    time_limit_seconds: int | None = None, parent: Run | None = None, auto_resume: bool = False,
    user_caps: bool = True,
) -> Run:
    """Validate, create the run with a waiting slot, and grant in the same transaction. `auto_resume`: when the
    run fails, the platform resumes it from its last checkpoint (at most RUN_AUTO_RESUME_MAX times).
    `origin` is trusted here (the API derives it: runs.limits.origin_for_request). Every run gets a finite time
    limit (the staff default when none is given; above the staff maximum is a 400). `user_caps`: refuse with
    LimitExceeded (429) when the owner is at a per-user cap; only automatic evaluation runs pass False."""
    if origin not in Origin.values:
        raise InvalidInput(f"unknown origin {origin!r}; expected one of {', '.join(Origin.values)}", field="origin")
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX:
        raise InvalidInput(f"must be a non-empty string of at most {NAME_MAX} characters", field="name")
    if time_limit_seconds is not None and (
        not isinstance(time_limit_seconds, int) or isinstance(time_limit_seconds, bool)
        or not 1 <= time_limit_seconds <= TIME_LIMIT_MAX
    ):
        raise InvalidInput(f"must be an integer number of seconds from 1 to {TIME_LIMIT_MAX}",
                           field="time_limit_seconds")
    if not isinstance(auto_resume, bool):
        raise InvalidInput("must be true or false", field="auto_resume")
    run_kind = kinds.kind_get(kind)
    if not isinstance(config, dict):
        raise InvalidInput("must be a JSON object", field="config")
    if "\\u0000" in json.dumps(config):
        raise InvalidInput("must not contain NUL characters", field="config")
    config = run_kind.validate_config(config)
    if run_kind.authorize is not None:
        run_kind.authorize(config, owner)
    started = time.time()
    with transaction.atomic():
        store.slots_lock()
        user_limits = limits.limits_load()
        time_limit_seconds = limits.time_limit_resolve(time_limit_seconds, user_limits)
        if user_caps:
            limits.user_caps_check(owner=owner, limits=user_limits)
        now = timezone.now()
        run = Run.objects.create(
            name=name.strip(), origin=origin, run_class=ORIGIN_TO_CLASS[origin], kind=run_kind.name, config=config,
            owner=owner, time_limit_seconds=time_limit_seconds, parent=parent, status=RunStatus.QUEUED,
            auto_resume=auto_resume,
        )
        store.slot_enqueue(run_id=run.pk, run_class=run.run_class, now=now)
        run_events_record(run=run, source=PLATFORM_SOURCE, events=[{
            "type": "status", "ts": now, "data": {"status": RunStatus.QUEUED, "previous": None, "error": ""},
        }])
        dashboard_publish({"kind": "run_status", "run": run.pk, "owner": run.owner_id, "name": run.name,
                           "run_class": run.run_class, "status": RunStatus.QUEUED, "previous": None})
        _grant_pass(reason="submit", started=started)
    run.refresh_from_db()
    return run


def run_transition(*, run: Run, status: str, error: str | None = None) -> Run:
    """Status changes that keep the slot (e.g. starting -> running). Finishing goes through run_finish."""
    if status in FINISHED_STATUSES:
        return run_finish(run=run, status=status, error=error or "")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        return run_status_change(run=locked, status=status, error=error)


def _finish_locked(*, run: Run, status: str, error: str, now: datetime | None = None) -> None:
    run_status_change(run=run, status=status, error=error, now=now)
    store.slot_release(run_id=run.pk)


def run_finish(*, run: Run, status: str, error: str = "") -> Run:
    """End a run: status, slot released, and the next waiting runs granted, all in one transaction.
    Finishing an already finished run is a no-op (racing finalizers: the first one wins)."""
    if status not in FINISHED_STATUSES:
        raise InvalidInput(f"must be one of {', '.join(FINISHED_STATUSES)}", field="status")
    started = time.time()
    # No savepoint when nested (two round trips, one of them under the grant lock). A refused transition is
    # detected before anything is written, and raised outside the block so the caller's transaction stays usable.
    refused: InvalidTransition | None = None
    with transaction.atomic(savepoint=False):
        try:
            if connection.vendor == "postgresql":
                return _finish_pg(run_id=run.pk, status=status, error=error, started=started)  # takes the lock
            store.slots_lock()
            locked = Run.objects.select_for_update().get(pk=run.pk)
            if locked.status in FINISHED_STATUSES:
                return locked
            _finish_check(run_id=locked.pk, current=locked.status, status=status)
            _finish_locked(run=locked, status=status, error=error)
            _grant_pass(reason="release", started=started)
        except _Refused as exc:
            refused = exc.error
    if refused is not None:
        raise refused
    return locked


class _Refused(Exception):
    """A refused finish, raised before anything was written (so the block may end normally)."""

    def __init__(self, error: InvalidTransition) -> None:
        super().__init__(str(error))
        self.error = error


def _finish_check(*, run_id: int, current: str, status: str) -> None:
    if status not in TRANSITIONS.get(current, set()):
        raise _Refused(InvalidTransition(f"cannot move run {run_id} from {current} to {status}", field="status"))


def _finish_pg(*, run_id: int, status: str, error: str, started: float) -> Run:
    """run_finish on PostgreSQL: lock + release + snapshot in one round trip, then one grant pass."""
    now = timezone.now()
    allowed = [prev for prev, targets in TRANSITIONS.items() if status in targets]
    finished, snapshot = slots_pg.release_with_snapshot(run_id=run_id, status=status, error=error,
                                                        allowed_from=allowed, source=PLATFORM_SOURCE, now=now)
    if finished is None:
        current = Run.objects.get(pk=run_id)  # row already locked by the statement above
        if current.status in FINISHED_STATUSES:
            return current
        _finish_check(run_id=run_id, current=current.status, status=status)
        raise RuntimeError(f"run {run_id}: finish to {status} from {current.status} was not applied")
    previous = finished.previous_status
    run_event_publish({"run": run_id, "seq": finished.last_seq, "ts": now.timestamp(), "type": "status",
                       "data": {"status": status, "previous": previous, "error": error}})
    dashboard_publish({"kind": "run_status", "run": run_id, "owner": finished.owner_id, "name": finished.name,
                       "run_class": finished.run_class, "status": status, "previous": previous})
    _grant_pass(reason="release", started=started, snapshot=snapshot, now=now)
    return finished


def run_cancel(*, run: Run, by: Any) -> Run:
    """Queued: cancelled at once and its slot removed. Active: `stopping`; the kind's stop hook ends the job."""
    with transaction.atomic():
        store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status == RunStatus.QUEUED:
            _finish_locked(run=locked, status=RunStatus.CANCELLED, error=f"cancelled by {by}")
            return locked
        if locked.status in (RunStatus.STARTING, RunStatus.RUNNING):
            run_status_change(run=locked, status=RunStatus.STOPPING, error=f"cancel requested by {by}")
            from runs.tasks import stop_run

            transaction.on_commit(lambda: stop_run.delay(locked.pk))
            return locked
        if locked.status == RunStatus.STOPPING:
            return locked
    raise InvalidTransition(f"run {run.pk} is already {locked.status}", field="status")


def run_resume(*, run: Run, by: Any, user_caps: bool = True) -> Run:
    """Re-queue a failed or cancelled run (same run, same event stream; `resume_requested` tells the launcher
    to continue from the last checkpoint). A resume adds a queued run, so the owner's per-user caps apply
    (`user_caps=False` only for the platform's automatic resume of a run that just failed)."""
    started = time.time()
    with transaction.atomic():
        store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
            raise InvalidTransition(f"only failed or cancelled runs can resume; run is {locked.status}",
                                    field="status")
        if user_caps:
            limits.user_caps_check(owner=locked.owner_id, limits=limits.limits_load())
        locked.resume_requested = True
        # A new attempt: a new Ray submission id (the old job's id is taken) and a new event source.
        locked.attempt += 1
        locked.save(update_fields=["resume_requested", "attempt"])
        run_status_change(run=locked, status=RunStatus.QUEUED, error="")
        store.slot_enqueue(run_id=locked.pk, run_class=locked.run_class, now=timezone.now())
        _grant_pass(reason="resume", started=started)
    locked.refresh_from_db()
    return locked


def run_heartbeat(*, run: Run) -> bool:
    """Record that the run's executor is alive; False when the run is no longer active."""
    return Run.objects.filter(pk=run.pk, status__in=ACTIVE_STATUSES).update(heartbeat_at=timezone.now()) > 0


def _fail_active(run_ids: list[int], *, error_of: Any, reason: str) -> list[int]:
    """Fail each still-active run (one transaction each, so one bad row cannot block the sweep)."""
    failed: list[int] = []
    for run_id in run_ids:
        started = time.time()
        with transaction.atomic():
            store.slots_lock()
            locked = Run.objects.select_for_update().get(pk=run_id)
            if locked.status not in ACTIVE_STATUSES:
                continue
            _finish_locked(run=locked, status=RunStatus.FAILED, error=error_of(locked))
            _grant_pass(reason=reason, started=started)
            run_kind_stop_after_commit(locked)
            failed.append(run_id)
    return failed


def run_kind_stop_after_commit(run: Run) -> None:
    from runs.tasks import stop_run

    transaction.on_commit(lambda: stop_run.delay(run.pk))


def runs_reclaim_stale(*, now: datetime) -> list[int]:
    """Fail active runs whose executor stopped heartbeating (never heartbeated: counted from the grant)."""
    timeout = settings.SLOTS_HEARTBEAT_TIMEOUT_SECONDS
    cutoff = now - timedelta(seconds=timeout)
    stale = Run.objects.filter(status__in=ACTIVE_STATUSES).filter(
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, granted_at__lt=cutoff)
    )
    ids = list(stale.values_list("pk", flat=True))
    return _fail_active(ids, reason="reclaim",
                        error_of=lambda r: f"heartbeat lost: no heartbeat for more than {timeout} s")


def runs_enforce_time_limits(*, now: datetime) -> list[int]:
    """Fail active runs past their time limit, counted from the grant (time queued never counts). A run stored
    without a limit (submitted before limits were mandatory) gets the current staff default."""
    default = limits.limits_load().default_time_limit_seconds
    over = [
        r.pk for r in Run.objects.filter(status__in=ACTIVE_STATUSES, granted_at__isnull=False)
        .only("pk", "granted_at", "time_limit_seconds")
        if r.granted_at + timedelta(seconds=r.time_limit_seconds or default) <= now
    ]
    return _fail_active(over, reason="time_limit",
                        error_of=lambda r: f"time limit of {r.time_limit_seconds or default} s exceeded")


def settings_update(*, changes: Any, partial: bool, by: Any) -> dict[str, Any]:
    """Validate and store concurrency settings (partial merges, full replaces), then grant under new limits.
    Returns the new stored raw settings. Raises InvalidInput naming the field."""
    try:
        policy_validate(changes)
    except PolicyError as exc:
        raise InvalidInput(exc.message, field=exc.field) from exc
    started = time.time()
    with transaction.atomic():
        store.slots_lock()
        row = ConcurrencySettings.objects.select_for_update().order_by("pk").first()
        raw = policy_merge(row.raw if row else {}, changes, partial=partial)
        try:
            policy_check_merged(raw, default_max_total=settings.SLOTS_DEFAULT_MAX_TOTAL, changes=changes)
        except PolicyError as exc:
            raise InvalidInput(exc.message, field=exc.field) from exc
        if row is None:
            row = ConcurrencySettings(raw=raw, updated_by=by if getattr(by, "pk", None) else None)
        else:
            row.raw, row.updated_by = raw, (by if getattr(by, "pk", None) else None)
        row.save()
        store.policy_forget()
        dashboard_publish({"kind": "settings"})
        _grant_pass(reason="settings", started=started)
    store.policy_forget()
    return raw


__all__ = ["run_cancel", "run_finish", "run_heartbeat", "run_resume", "run_status_change", "run_submit",
           "run_transition", "runs_enforce_time_limits", "runs_reclaim_stale", "settings_update", "slots_grant"]
