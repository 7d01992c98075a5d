"""The run state machine, in one place: its states, the allowed moves (`TRANSITIONS`), the columns each move
stamps (`stamp`), and the side effects of every move: a numbered `status` event, slot release and grant,
publishing to the dashboard, the hand-off of granted runs to the launcher and the follow-ups of a finish.

Both ways a move is written (the ORM, and one SQL statement per step on PostgreSQL) live in runs/stores.py
and take their rules from here (`allowed_from`, `stamp`); tests/runs/test_lifecycle_stores.py checks that
they accept and refuse the same moves. Every way a run ends goes through `run_finish`.

Celery tasks are named here, not imported: runs.tasks (the entry points) sits above this module.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from datetime import datetime
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runs import limits
from runs.errors import InvalidInput, InvalidTransition
from runs.events import PLATFORM_SOURCE, run_events_record
from runs.models import FINISHED_STATUSES, Run, RunStatus, Slot, SlotState
from runs.notify import slots_notify
from runs.realtime import dashboard_publish
from runs.slots import store as slot_store
from runs.stores import Moved, moved_publish, run_events_publish, run_store, status_write

STATES: tuple[str, ...] = tuple(RunStatus.values)
# Allowed moves; anything else is a bug in the caller and raises InvalidTransition.
TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.QUEUED: frozenset({RunStatus.STARTING, RunStatus.CANCELLED, RunStatus.FAILED}),
    # starting -> queued: the run's placement group was not ready in time (run_requeue); not a failure.
    RunStatus.STARTING: frozenset({RunStatus.RUNNING, RunStatus.STOPPING, RunStatus.QUEUED, *FINISHED_STATUSES}),
    RunStatus.RUNNING: frozenset({RunStatus.STOPPING, *FINISHED_STATUSES}),
    RunStatus.STOPPING: frozenset(FINISHED_STATUSES),
    RunStatus.SUCCEEDED: frozenset({RunStatus.QUEUED}),
    RunStatus.FAILED: frozenset({RunStatus.QUEUED}),
    RunStatus.CANCELLED: frozenset({RunStatus.QUEUED}),
}

logger = logging.getLogger(__name__)
_discovery_lock = threading.Lock()

TASK_DISPATCH = "runs.tasks.dispatch_run"
TASK_STOP = "runs.tasks.stop_run"
TASK_FOLLOWUPS = "runs.tasks.run_followups"


def move_allowed(previous: str, status: str) -> bool:
    return status in TRANSITIONS.get(previous, frozenset())


def allowed_from(status: str) -> list[str]:
    """The states a run may be in to move to `status` (what the SQL path's WHERE clause is built from)."""
    return sorted(previous for previous, targets in TRANSITIONS.items() if status in targets)


def stamp(status: str, now: datetime) -> dict[str, datetime | None]:
    """The timestamp columns a move to `status` sets (besides status, error and last_seq)."""
    if status == RunStatus.STARTING:
        return {"granted_at": now, "started_at": None, "heartbeat_at": None}
    if status == RunStatus.RUNNING:
        return {"started_at": now, "heartbeat_at": now}
    if status in FINISHED_STATUSES:
        return {"finished_at": now}
    if status == RunStatus.QUEUED:
        return {"granted_at": None, "started_at": None, "finished_at": None, "heartbeat_at": None}
    return {}


def task_named(name: str) -> Any:
    """A Celery task by name. A process that is not a worker (web, scripts) has not yet run the autodiscovery a
    worker runs at start-up; the first lookup runs it (once: concurrent first lookups wait for it)."""
    if name not in current_app.tasks:
        with _discovery_lock:
            if name not in current_app.tasks:
                current_app.loader.import_default_modules()
    return current_app.tasks[name]


def task_after_commit(name: str, *args: Any) -> None:
    """Hand a task to Celery once the current transaction commits (nothing is sent if it rolls back)."""
    transaction.on_commit(lambda: task_named(name).delay(*args))


def run_status_change(*, run: Run, status: str, error: str | None = None, now: datetime | None = None) -> Run:
    """Move a run (loaded with select_for_update in the current transaction) to `status`: stamp, numbered
    `status` event, publish after commit. The slot row is the caller's business."""
    if not move_allowed(run.status, status):
        raise InvalidTransition(f"cannot move run {run.pk} from {run.status} to {status}", field="status")
    now = now or timezone.now()
    moved = status_write(run=run, status=status, error=error, now=now, columns=stamp(status, now))
    moved_publish(moved, ts=now.timestamp())
    return run


def grant_pass(*, reason: str, started: float, snapshot: Any = None, now: datetime | None = None) -> list[int]:
    """Grant under the lock (already held): runs move to `starting` and are handed to the launcher after commit."""
    now = now or timezone.now()
    notify: dict[str, Any] = {"reason": reason, "granted": [], "t": started}
    moved = run_store().grant(
        now=now,
        snapshot=snapshot,
        notify=notify,
        allowed=allowed_from(RunStatus.STARTING),
        columns=stamp(RunStatus.STARTING, now),
    )
    granted = [m.run_id for m in moved]
    for m in moved:
        moved_publish(m, ts=now.timestamp())
        task_after_commit(TASK_DISPATCH, m.run_id)
    if not run_store().notifies_grants or not granted:
        slots_notify({"reason": reason, "granted": granted, "t": started})  # else sent with the grants
    return granted


def slots_grant(*, reason: str = "tick") -> list[int]:
    """Run one serialized grant pass in its own transaction; returns the granted run ids."""
    started = time.time()
    with transaction.atomic():
        slot_store.slots_lock()
        return grant_pass(reason=reason, started=started)


def run_enqueue(*, run: Run, now: datetime) -> None:
    """A new run (created `queued` under the grant lock): its waiting slot, its first event, then a grant."""
    slot_store.slot_enqueue(
        run_id=run.pk,
        run_class=run.run_class,
        now=now,
        resources=run.resources,
        time_limit_seconds=run.time_limit_seconds,
    )
    run_events_publish(
        run_events_record(
            run=run,
            source=PLATFORM_SOURCE,
            events=[
                {
                    "type": "status",
                    "ts": now,
                    "data": {"status": RunStatus.QUEUED, "previous": None, "error": ""},
                }
            ],
        )
    )
    dashboard_publish(
        {
            "kind": "run_status",
            "run": run.pk,
            "owner": run.owner_id,
            "name": run.name,
            "run_class": run.run_class,
            "status": RunStatus.QUEUED,
            "previous": None,
        }
    )
    grant_pass(reason="submit", started=time.time(), now=now)


def run_transition(*, run: Run, status: str, error: str | None = None) -> Run:
    """Status changes that keep the slot (e.g. starting -> running). Finishing goes through run_finish."""
    if status in FINISHED_STATUSES:
        return run_finish(run=run, status=status, error=error or "")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        return run_status_change(run=locked, status=status, error=error)


def _followups_run(run_id: int, attempt: int) -> None:
    """Run the follow-ups task here and now; if that fails, hand it to a worker, which retries it."""
    task = task_named(TASK_FOLLOWUPS)
    try:
        task.apply(args=(run_id, attempt), throw=True)
    except Exception:  # noqa: BLE001 - the finish is committed; the follow-up must not be lost with this error
        logger.warning("run %s: follow-ups failed here; handed to a worker", run_id, exc_info=True)
        task.delay(run_id, attempt)


def _followups_schedule(run: Run) -> None:
    """After a finish: an evaluation may follow a success, a resume a failure (runs/execution/followups.py
    decides; the task is idempotent). Scheduled in the finishing transaction: it runs only if the finish
    commits, right after it, in this process, or (on an error there) in a worker that retries it."""
    if run.status == RunStatus.SUCCEEDED or (
        run.status == RunStatus.FAILED and run.auto_resume and run.attempt < settings.RUN_AUTO_RESUME_MAX
    ):
        transaction.on_commit(functools.partial(_followups_run, run.pk, run.attempt))


def run_finish(*, run: Run, status: str, error: str = "", stop_job: bool = False) -> Run:
    """End a run, whatever ended it: status and event, slot released, next waiting runs granted, follow-ups
    scheduled, all in one transaction; `stop_job` also asks the launcher to stop the run's job after commit
    (the platform ended a run whose job may still be going). Finishing a finished run is a no-op (racing
    finalizers: the first one wins); any other refused move raises InvalidTransition."""
    if status not in FINISHED_STATUSES:
        raise InvalidInput(f"must be one of {', '.join(FINISHED_STATUSES)}", field="status")
    started = time.time()
    now = timezone.now()
    # No savepoint when nested (the lock, the release and the snapshot are one round trip on PostgreSQL). A
    # refused move writes nothing and is raised after the block, so the caller's transaction stays usable.
    with transaction.atomic(savepoint=False):
        finished, snapshot = run_store().finish(
            run_id=run.pk, status=status, error=error, now=now, allowed=allowed_from(status), columns=stamp(status, now)
        )
        if finished is not None:
            moved_publish(Moved.of(finished, status=status, previous=finished.previous_status), ts=now.timestamp())
            grant_pass(reason="release", started=started, snapshot=snapshot, now=now)
            _followups_schedule(finished)
            if stop_job:
                task_after_commit(TASK_STOP, finished.pk)
            return finished
        current = Run.objects.get(pk=run.pk)  # the row is locked by the store's attempt
    if current.status in FINISHED_STATUSES:
        return current
    raise InvalidTransition(f"cannot move run {run.pk} from {current.status} to {status}", field="status")


def run_cancel(*, run: Run, by: Any) -> Run:
    """Queued: cancelled at once and its slot removed. Active: `stopping`; the launcher ends the job."""
    with transaction.atomic():
        slot_store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status == RunStatus.QUEUED:
            return run_finish(run=locked, status=RunStatus.CANCELLED, error=f"cancelled by {by}")
        if locked.status in (RunStatus.STARTING, RunStatus.RUNNING):
            run_status_change(run=locked, status=RunStatus.STOPPING, error=f"cancel requested by {by}")
            task_after_commit(TASK_STOP, locked.pk)
            return locked
        if locked.status == RunStatus.STOPPING:
            return locked
    raise InvalidTransition(f"run {run.pk} is already {locked.status}", field="status")


def run_requeue(*, run: Run, reason: str) -> str | None:
    """Put a `starting` run back in the queue at its old position, holding nothing: its placement group was not
    ready in time (the job's `timeout` event, or the tick's fallback for a job that never posted). Not a failure:
    the slot goes back to `waiting` with its original requested_at, the attempt goes up (a new Ray submission id
    and ingest token: the old job's late posts and outcome are ignored), and the next runs are granted in the
    same transaction. Returns the old attempt's submission id (the caller stops that job if it may still run),
    or None when the run was no longer `starting` (nothing written)."""
    started = time.time()
    now = timezone.now()
    with transaction.atomic():
        slot_store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status != RunStatus.STARTING:
            return None
        old_submission = locked.ray_submission_id
        locked.attempt += 1
        locked.pending_reason, locked.pending_detail = "", f"requeued: {reason}"[:300]
        locked.save(update_fields=["attempt", "pending_reason", "pending_detail"])
        run_status_change(run=locked, status=RunStatus.QUEUED, error="", now=now)
        # Back to `waiting` with its original requested_at (the same queue position), placed nowhere.
        Slot.objects.filter(run_id=locked.pk).update(state=SlotState.WAITING, granted_at=None, placement=[])
        grant_pass(reason="requeue", started=started, now=now)
    logger.info("run %s: requeued at its old position (%s)", run.pk, reason)
    return old_submission


def run_resume(*, run: Run, by: Any, user_caps: bool = True) -> Run:
    """Re-queue a failed or cancelled run (same run, same event stream; `resume_requested` tells the launcher
    to continue from the last checkpoint). A resume adds a queued run, so the owner's per-user caps apply
    (`user_caps=False` only for the platform's automatic resume of a run that just failed)."""
    started = time.time()
    with transaction.atomic():
        slot_store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
            raise InvalidTransition(f"only failed or cancelled runs can resume; run is {locked.status}", field="status")
        if user_caps:
            limits.user_caps_check(owner=locked.owner_id, limits=limits.limits_load())
        locked.resume_requested = True
        # A new attempt: a new Ray submission id (the old job's id is taken) and a new event source.
        locked.attempt += 1
        locked.save(update_fields=["resume_requested", "attempt"])
        run_status_change(run=locked, status=RunStatus.QUEUED, error="")
        slot_store.slot_enqueue(
            run_id=locked.pk,
            run_class=locked.run_class,
            now=timezone.now(),
            resources=locked.resources,
            time_limit_seconds=locked.time_limit_seconds,
        )
        grant_pass(reason="resume", started=started)
    locked.refresh_from_db()
    return locked
