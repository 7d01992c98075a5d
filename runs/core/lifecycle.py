"""The run state machine, in one place: its states, the allowed moves (`TRANSITIONS`), the columns each move
stamps (`stamp`), and the side effects of every move: a numbered `status` event, slot release and grant,
publishing to the dashboard, and the effects that must follow its commit (`granted_effects`, `finish_effects`).
The ways a run enters the queue (submit, requeue, resume) build on these moves in runs/scheduling/enqueue.py.

Both ways a move is written (the ORM, and one SQL statement per step on PostgreSQL) live in runs/core/stores.py
and take their rules from here (`allowed_from`, `stamp`); tests/runs/test_lifecycle_stores.py checks that
they accept and refuse the same moves. Every way a run ends goes through `run_finish`.

The effects (launch a granted run, stop a job, a finish's follow-ups) are outbox rows the stores write with the
move, in its transaction (runs/outbox/), drained after the commit and by the tick; no Celery task is named here.
"""

from __future__ import annotations

import functools
import logging
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from runs.core.moves import Moved, moved_publish, status_write
from runs.core.stores import RunStore, run_store
from runs.errors import InvalidInput, InvalidTransition
from runs.metrics.hooks import grants_record
from runs.models import FINISHED_STATUSES, Run, RunStatus
from runs.outbox.effects import Dispatch, FollowUps, RunEffect, StopJob
from runs.outbox.store import effects_kick
from runs.slots import store as slot_store
from runs.slots.grant import Snapshot
from runs.webhooks.emit import finish_webhooks, grant_webhooks, status_emit

STATES: tuple[str, ...] = tuple(RunStatus.values)
# Allowed moves; anything else is a bug in the caller and raises InvalidTransition.
TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.QUEUED: frozenset({RunStatus.STARTING, RunStatus.CANCELLED, RunStatus.FAILED}),
    # -> queued, not a failure (runs.scheduling.enqueue.run_requeue): a starting run's placement group was not ready in
    # time; a starting or running run's job was ended by the platform's own stop or crash (runs/execution/restart.py).
    RunStatus.STARTING: frozenset({RunStatus.RUNNING, RunStatus.STOPPING, RunStatus.QUEUED, *FINISHED_STATUSES}),
    RunStatus.RUNNING: frozenset({RunStatus.STOPPING, RunStatus.QUEUED, *FINISHED_STATUSES}),
    RunStatus.STOPPING: frozenset(FINISHED_STATUSES),
    RunStatus.SUCCEEDED: frozenset({RunStatus.QUEUED}),
    RunStatus.FAILED: frozenset({RunStatus.QUEUED}),
    RunStatus.CANCELLED: frozenset({RunStatus.QUEUED}),
}

logger = logging.getLogger(__name__)

# A catch-up gives up after this many locked passes in a row that granted nothing although its check said they
# would. Now and then that is a race (another catch-up granted in between); always, it would be a bug: the tick
# grants then.
CATCH_UP_IDLE_PASSES = 20


def move_allowed(previous: str, status: str) -> bool:
    return status in TRANSITIONS.get(previous, frozenset())


def allowed_from(status: str) -> list[str]:
    """The states a run may be in to move to `status` (what the SQL path's WHERE clause is built from)."""
    return sorted(previous for previous, targets in TRANSITIONS.items() if status in targets)


def stamp(status: str, now: datetime) -> dict[str, Any]:
    """The columns a move to `status` sets besides status, error and last_seq: its timestamps and, once the run
    runs or ends, its pending reason cleared (a `starting` run's `waiting_for_resources` or `starting_processes`
    is over). A move that ends the attempt or starts a new one clears its session server's URL (the proxy then
    answers 404 or 503); `running` keeps it (the job may report it in the post that makes it running)."""
    if status == RunStatus.STARTING:
        return {"granted_at": now, "started_at": None, "heartbeat_at": None, "serving_url": ""}
    if status == RunStatus.RUNNING:
        return {"started_at": now, "heartbeat_at": now, "pending_reason": "", "pending_detail": ""}
    if status in FINISHED_STATUSES:
        return {"finished_at": now, "pending_reason": "", "pending_detail": "", "serving_url": ""}
    if status == RunStatus.QUEUED:
        return {"granted_at": None, "started_at": None, "finished_at": None, "heartbeat_at": None, "serving_url": ""}
    return {}


def granted_effects(run_ids: list[int], now: datetime) -> list[RunEffect]:
    """A grant at `now` implies its run's launch, and telling it to the webhooks subscribed to it."""
    return [*(Dispatch(run_id=run_id, at=now) for run_id in run_ids), *grant_webhooks(run_ids, now)]


def finish_effects(run: Run, status: str, now: datetime, *, stop_job: bool) -> list[RunEffect]:
    """A finish at `now` implies its follow-ups after a success or after a failure of a run that may resume
    (runs/execution/followups.py decides what they are; `auto_resume` never changes, a stale `attempt` only adds
    follow-ups that find the limit reached), and its job's stop when the platform ended the run (`stop_job`)."""
    effects: list[RunEffect] = [StopJob(run_id=run.pk, at=now, job=run.ray_submission_id)] if stop_job else []
    if status == RunStatus.SUCCEEDED or (
        status == RunStatus.FAILED and run.auto_resume and run.attempt < settings.RUN_AUTO_RESUME_MAX
    ):
        effects.append(FollowUps(run_id=run.pk, at=now))
    return [*effects, *finish_webhooks(run, now)]  # told to its webhooks (runs/webhooks/emit.py)


def run_status_change(*, run: Run, status: str, error: str | None = None, now: datetime | None = None) -> Run:
    """Move a run (loaded with select_for_update in the current transaction) to `status`: stamp, numbered
    `status` event, publish after commit. The slot row is the caller's business."""
    if not move_allowed(run.status, status):
        raise InvalidTransition(f"cannot move run {run.pk} from {run.status} to {status}", field="status")
    now = now or timezone.now()
    moved = status_write(run=run, status=status, error=error, now=now, columns=stamp(status, now))
    status_emit(run=run, status=status, previous=moved.previous, error=run.error, at=now)  # its webhooks
    moved_publish(moved, ts=now.timestamp())
    return run


def grant_pass(*, reason: str, now: datetime | None = None) -> list[int]:
    """Grant under the lock (already held): runs move to `starting`, their launches stored with the move."""
    now = now or timezone.now()
    allowed, columns = allowed_from(RunStatus.STARTING), stamp(RunStatus.STARTING, now)
    moved = run_store().grant(now=now, allowed=allowed, columns=columns, effects=granted_effects)
    _granted(moved, reason=reason, now=now)
    return [m.run_id for m in moved]


def _granted(moved: list[Moved], *, reason: str, now: datetime, waits: list[tuple[str, float]] | None = None) -> None:
    """Granted runs published, launched (their stored effects drained) and counted, after the commit (at once
    when committed). `waits`: add their admission waits there (the caller records them), not recorded here."""
    for m in moved:
        moved_publish(m, ts=now.timestamp())
    if not moved:
        return
    effects_kick(granted_effects([m.run_id for m in moved], now))
    logger.debug("grant (%s): %s", reason, [m.run_id for m in moved])
    mine = [(m.run_class, (now - m.requested_at).total_seconds()) for m in moved if m.requested_at is not None]
    if waits is not None:
        waits.extend(mine)
    else:
        transaction.on_commit(functools.partial(grants_record, mine), robust=True)


def slots_grant(*, reason: str = "tick") -> list[int]:
    """Run one serialized grant pass in its own transaction; returns the granted run ids."""
    with transaction.atomic():
        slot_store.slots_lock()
        return grant_pass(reason=reason)


def grants_catch_up(*, reason: str = "catch-up", check_first: bool = True, first: Snapshot | None = None) -> list[int]:
    """After a commit (never inside a transaction): grant what releases committed so far have freed, in passes of
    one locked transaction each (`RunStore.catch_up_pass`: it commits, then checks without the lock), until a
    check finds nothing to grant. Stops, too, when another transaction holds the lock: that holder runs this
    after its own commit, and its check then sees every release committed before (the argument is in
    docs/slots.md). PostgreSQL; the tick is the fallback. `check_first`: check before the first pass. `first`:
    this session holds the lock already with this snapshot (a release's probe): the first pass runs on it."""
    store = run_store()
    granted: list[int] = []
    waits: list[tuple[str, float]] = []
    try:
        _catch_up(store, reason=reason, check_first=check_first, first=first, granted=granted, waits=waits)
    finally:
        grants_record(waits)  # one metrics write for all passes (committed ones only)
    return granted


def _catch_up(
    store: RunStore, *, reason: str, check_first: bool, first: Snapshot | None, granted: list[int], waits: list
) -> None:
    idle_passes = 0
    pending = first is not None or not check_first or store.grant_pending()
    while pending:
        if idle_passes >= CATCH_UP_IDLE_PASSES:
            logger.warning("grant catch-up: the check keeps finding grants the locked pass does not make; tick retries")
            return
        now = timezone.now()
        try:
            held, first = first, None
            allowed, columns = allowed_from(RunStatus.STARTING), stamp(RunStatus.STARTING, now)
            passed = store.catch_up_pass(now=now, allowed=allowed, columns=columns, effects=granted_effects, first=held)
        except InvalidTransition:  # a chosen run was finished meanwhile (without the lock): decide again
            passed = [], store.grant_pending()
        if passed is None:
            return
        moved, pending = passed
        _granted(moved, reason=reason, now=now, waits=waits)  # committed: published and handed over at once
        granted += [m.run_id for m in moved]
        idle_passes = 0 if moved else idle_passes + 1


slot_store.after_unlock_register(grants_catch_up)


def run_transition(*, run: Run, status: str, error: str | None = None) -> Run:
    """Status changes that keep the slot (e.g. starting -> running). Finishing goes through run_finish."""
    if status in FINISHED_STATUSES:
        return run_finish(run=run, status=status, error=error or "")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        return run_status_change(run=locked, status=status, error=error)


def run_finish(*, run: Run, status: str, error: str = "", stop_job: bool = False) -> Run:
    """End a run, whatever ended it: status and event, slot released, next waiting runs granted, follow-ups
    stored with the move (`finish_effects`); `stop_job` also stores the stop of the run's job (the platform ended
    a run whose job may still be going). Finishing a finished run is a no-op (racing finalizers: the first one
    wins, and only its effects are stored); any other refused move raises InvalidTransition.

    When the grant happens: in the same transaction when it holds the grant lock already (the caller took it,
    or the store takes it for the release: SQLite). Otherwise (PostgreSQL) the release commits on its own and
    the freed capacity is granted right after that commit (`grants_catch_up`, on commit): nested in a caller's
    transaction, that is after the caller's commit, since no other transaction can see the slot free before."""
    if status not in FINISHED_STATUSES:
        raise InvalidInput(f"must be one of {', '.join(FINISHED_STATUSES)}", field="status")
    now = timezone.now()
    store = run_store()
    effects = finish_effects(run, status, now, stop_job=stop_job)

    def release(probe: bool) -> tuple[Run | None, Snapshot | None]:
        allowed, columns = allowed_from(status), stamp(status, now)
        return store.finish(
            run_id=run.pk,
            status=status,
            error=error,
            now=now,
            allowed=allowed,
            columns=columns,
            effects=effects,
            probe=probe,
        )

    if store.releases_unlocked and not connection.in_atomic_block:
        # PostgreSQL, no caller's transaction: the release is one statement, committed on its own (autocommit),
        # then, in the same round trip, a try of the grant lock with the snapshot: taken by another, its holder
        # grants for this release; taken here (`held`), the first pass runs on that snapshot and releases it.
        finished, held = release(probe=True)
        if finished is not None:
            _finished(finished, now=now, effects=effects, grant="after" if held is not None else "holder", held=held)
            return finished
        if held is not None:
            _grant_after_release(run, held)  # nothing was freed, but the lock must go: the pass releases it
        return _refused(run, status)
    # No savepoint when nested (the release is one statement on PostgreSQL). A refused move writes nothing and is
    # raised after the block, so the caller's transaction stays usable.
    with transaction.atomic(savepoint=False):
        finished, _ = release(probe=False)
        if finished is not None:
            grant = "now" if not store.releases_unlocked or slot_store.lock_held() else "on_commit"
            _finished(finished, now=now, effects=effects, grant=grant)
            return finished
    return _refused(run, status)


def _finished(run: Run, *, now: datetime, effects: list[RunEffect], grant: str, held: Snapshot | None = None) -> None:
    """What follows a release: its publishing, the grant (`now`: this transaction holds the lock; `after`: the
    release is committed, and `held` the snapshot read under the lock its probe took; `on_commit`; `holder`:
    committed, and the lock's holder then grants for it), then its stored effects drained (after commit)."""
    try:
        moved_publish(Moved.of(run, status=run.status, previous=run.previous_status), ts=now.timestamp())
    finally:
        if grant == "after":  # even when publishing failed: a held lock must be released
            _grant_after_release(run, held)
    if grant == "now":
        grant_pass(reason="release", now=now)
    elif grant == "on_commit":
        catch_up = functools.partial(grants_catch_up, reason="release", check_first=False)
        transaction.on_commit(catch_up, robust=True)
    effects_kick(effects)


def _grant_after_release(run: Run, held: Snapshot | None) -> None:
    try:
        grants_catch_up(reason="release", check_first=False, first=held)
    except Exception:  # noqa: BLE001 - the release is committed: it must not look failed; the tick grants
        logger.exception("run %s: granting after its release failed", run.pk)


def _refused(run: Run, status: str) -> Run:
    """The store refused the move: a no-op when the run is finished already, else InvalidTransition."""
    current = Run.objects.get(pk=run.pk)
    if current.status in FINISHED_STATUSES:
        return current
    raise InvalidTransition(f"cannot move run {run.pk} from {current.status} to {status}", field="status")
