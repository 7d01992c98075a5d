"""How a run enters the queue: a new run (`run_enqueue`), a `starting` run put back at its old position after
its placement timed out (`run_requeue`), a failed or cancelled run resumed (`run_resume`). Each takes its
moves from the state machine in runs/core/lifecycle.py and ends with a grant pass.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs.audit.models import Action
from runs.audit.record import PLATFORM_ACTOR, actor_of, audit_record
from runs.core.checkpoints import run_checkpoint_step
from runs.core.events import PLATFORM_SOURCE, STATUS, run_events_record
from runs.core.lifecycle import grant_pass, run_status_change
from runs.core.publish import dashboard_publish
from runs.core.stores import run_events_publish
from runs.errors import InvalidTransition, NoCheckpoint
from runs.messages import status_move_data
from runs.models import Run, RunStatus, Slot, SlotState
from runs.scheduling import limits
from runs.slots import store as slot_store

logger = logging.getLogger(__name__)


def run_enqueue(*, run: Run, now: datetime) -> None:
    """A new run (created `queued` under the grant lock): its waiting slot, its first event, then a grant."""
    slot_store.slot_enqueue(
        run_id=run.pk,
        run_class=run.run_class,
        now=now,
        resources=run.resources,
        time_limit_seconds=run.time_limit_seconds,
        owner=run.owner_id,
    )
    run_events_publish(
        run_events_record(
            run=run,
            source=PLATFORM_SOURCE,
            events=[
                {
                    "type": STATUS,
                    "ts": now,
                    "data": status_move_data(status=RunStatus.QUEUED, previous=None, error=""),
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
    grant_pass(reason="submit", now=now)


def run_requeue(*, run: Run, reason: str, interrupted: bool = False, grant: bool = True) -> str | None:
    """Put a `starting` run back in the queue at its old position, holding nothing: its placement group was not
    ready in time (the job's `timeout` event, or the tick's fallback for a job that never posted). Not a failure:
    the slot goes back to `waiting` with its original requested_at, the attempt goes up (a new Ray submission id
    and ingest token: the old job's late posts and outcome are ignored), and the next runs are granted in the
    same transaction (unless not `grant`). Returns the old attempt's submission id (the caller stops that job if
    it may still run), or None when the run was not in a status it may leave so (nothing written).

    `interrupted`: the platform's own stop or crash ended the job (runs/execution/restart.py); a `running` run
    goes back too, and continues from its latest checkpoint when it has one (else from step 0)."""
    now = timezone.now()
    allowed = (RunStatus.STARTING, RunStatus.RUNNING) if interrupted else (RunStatus.STARTING,)
    with transaction.atomic():
        slot_store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status not in allowed:
            return None
        old_submission, before = locked.ray_submission_id, {"status": locked.status, "attempt": locked.attempt}
        locked.attempt += 1
        locked.pending_reason, locked.pending_detail = "", f"requeued: {reason}"[:300]
        fields = ["attempt", "pending_reason", "pending_detail"]
        if interrupted:
            locked.resume_requested = run_checkpoint_step(locked) is not None
            fields.append("resume_requested")
        locked.save(update_fields=fields)
        run_status_change(run=locked, status=RunStatus.QUEUED, error="", now=now)
        # Back to `waiting` with its original requested_at (the same queue position), placed nowhere.
        Slot.objects.filter(run_id=locked.pk).update(state=SlotState.WAITING, granted_at=None, placement=[])
        after = {"status": RunStatus.QUEUED, "attempt": locked.attempt, "reason": reason[:300]}
        audit_record(
            PLATFORM_ACTOR, Action.RUN_REQUEUE, target_type="run", target_id=run.pk, before=before, after=after
        )
        if grant:
            grant_pass(reason="requeue", now=now)
    logger.info("run %s: requeued at its old position (%s)", run.pk, reason)
    return old_submission


def run_resume(*, run: Run, by: Any, user_caps: bool = True, from_scratch: bool = False) -> Run:
    """Re-queue a failed or cancelled run (same run, same event stream). It continues from its latest
    checkpoint (`resume_requested`: the launcher adds `--resume`); a run without one is refused (409,
    code `no_checkpoint`, runs/core/checkpoints.py) unless `from_scratch`, which starts it over from step 0 (no
    `--resume`, whatever checkpoint it has). A resume adds a queued run, so the owner's per-user caps apply
    (`user_caps=False` only for the platform's automatic resume of a run that just failed). `by`: an Actor, a
    user, or anything else for the platform (audited with the move)."""
    actor = actor_of(by)
    with transaction.atomic():
        slot_store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
            raise InvalidTransition(f"only failed or cancelled runs can resume; run is {locked.status}", field="status")
        if not from_scratch and run_checkpoint_step(locked) is None:
            raise NoCheckpoint(
                f'run {locked.pk} has no checkpoint to resume from; send {{"from_scratch": true}} to start it '
                "over from step 0",
                field="from_scratch",
            )
        if user_caps:
            limits.user_caps_check(owner=locked.owner_id, limits=limits.limits_load())
        before = {"status": locked.status, "attempt": locked.attempt}
        locked.resume_requested = not from_scratch
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
            owner=locked.owner_id,
        )
        after = {"status": RunStatus.QUEUED, "attempt": locked.attempt, "from_scratch": from_scratch}
        audit_record(actor, Action.RUN_RESUME, target_type="run", target_id=locked.pk, before=before, after=after)
        grant_pass(reason="resume")
    logger.info("run %s resumed by %s%s", run.pk, actor.name, " from step 0 (from_scratch)" if from_scratch else "")
    locked.refresh_from_db()
    return locked
