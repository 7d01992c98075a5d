"""Preemption, applied (docs/slots.md "Preemption"): the one writer of a run's preemptions (`Preemption` rows and
the run's `preempted_by` / `preempt_state` / `preempt_reason`), and of their `preempt_requested`, `preempted` and
`resumed` events.

- `preemptions_request` (the tick, under the grant lock): the victims the pure selection chooses
  (runs/slots/preempt.py) are asked to checkpoint and stop through the stop a cancel or a platform stop uses: a
  `StopJob` outbox effect stored with the request (one per preemption, done once), Ray signals the job, the
  trainer checkpoints and exits. Audited as `run.preempt`.
- `preempt_requeue`: the victim's job ended (runs/execution/outcome.py: its final report or Ray's STOPPED), or
  its grace period passed (`preemptions_overdue`, the tick: "stopped hard", its job stopped again): the run goes
  back to `queued` at its old place (runs.scheduling.enqueue.run_requeue, `interrupted`: its next attempt resumes
  from its latest checkpoint), and the grant in the same transaction gives its place to the run it was chosen for.
  Its `run.preempted` webhook deliveries are stored in that transaction (runs/webhooks/emit.py), once.
- `preempt_resumed` (ingest, when the next attempt reports running): the `resumed` event.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs.audit.models import Action
from runs.audit.record import PLATFORM_ACTOR, audit_record
from runs.core.checkpoints import run_checkpoint_step
from runs.core.events import PLATFORM_SOURCE, run_events_record
from runs.core.publish import run_summary_publish
from runs.core.stores import run_events_publish
from runs.models import Preemption, Run, RunStatus
from runs.models_preempt import PreemptOutcome
from runs.outbox.effects import StopJob
from runs.outbox.store import effects_kick, effects_store
from runs.preempt_messages import (
    PREEMPT_REQUESTED,
    PREEMPTED,
    RESUMED,
    PreemptedData,
    PreemptRequestedData,
    ResumedData,
)
from runs.scheduling.enqueue import run_requeue
from runs.scheduling.preemption import held_states, preempt_snapshot
from runs.slots import store as slot_store
from runs.slots.preempt import Victim, choose
from runs.webhooks.emit import PreemptedHookData, preempted_emit

logger = logging.getLogger(__name__)

REQUESTED, PREEMPTED_STATE, RESUMED_STATE, ENDED = "requested", "preempted", "resumed", "ended"


def trained_step(run: Run) -> int | None:
    """The latest trained step the platform knows (its summary's last `train` event), None before the first."""
    train = (run.summary or {}).get("train") if isinstance(run.summary, dict) else None
    step = train.get("step") if isinstance(train, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def preemptions_request(*, now: datetime | None = None) -> list[int]:
    """Choose victims and ask each to checkpoint and stop (the tick, after its grant pass); returns their ids.
    Nothing at all unless some class preempts and some is preemptible."""
    if not slot_store.policy_load().preemption.on:
        return []
    now = now or timezone.now()
    with transaction.atomic():
        slot_store.slots_lock()
        policy = slot_store.policy_load(fresh=True)
        if not policy.preemption.on:
            return []
        snapshot = preempt_snapshot(policy)
        victims = choose(snapshot, now, held_states(snapshot, now))
        return [v.run_id for v in victims if _request(v, grace=policy.preemption.grace_seconds, now=now)]


def _request(victim: Victim, *, grace: int, now: datetime) -> bool:
    run = Run.objects.select_for_update().get(pk=victim.run_id)
    if run.status != RunStatus.RUNNING:
        return False
    step, checkpoint = trained_step(run), run_checkpoint_step(run)
    deadline = now + timedelta(seconds=grace)
    reason = victim.reason[:300]
    Preemption.objects.create(
        run=run,
        preempted_by_id=victim.for_run,
        reason=reason,
        requested_at=now,
        deadline_at=deadline,
        job=run.ray_submission_id,
        step_at_request=step,
    )
    run.preempted_by_id, run.preempt_state, run.preempt_reason = victim.for_run, REQUESTED, reason
    run.save(update_fields=["preempted_by", "preempt_state", "preempt_reason"])
    data = PreemptRequestedData(
        by=victim.for_run,
        reason=reason,
        grace_seconds=grace,
        deadline=deadline.timestamp(),
        step=step,
        checkpoint_step=checkpoint,
    )
    _event(run, PREEMPT_REQUESTED, data, now)
    effects_store(stop := [StopJob(run_id=run.pk, at=now, job=run.ray_submission_id)], now=now)
    effects_kick(stop)
    after = {"preempted_by": victim.for_run, "reason": reason, "grace_seconds": grace, "job": run.ray_submission_id}
    audit_record(
        PLATFORM_ACTOR,
        Action.RUN_PREEMPT,
        target_type="run",
        target_id=run.pk,
        before={"status": run.status},
        after=after,
    )
    logger.info("run %s: preempted for run %s (grace %s s)", run.pk, victim.for_run, grace)
    return True


def _event(run: Run, kind: str, data: Any, now: datetime) -> None:
    run_events_publish(
        run_events_record(run=run, source=PLATFORM_SOURCE, events=[{"type": kind, "ts": now, "data": data}])
    )
    run_summary_publish(run_id=run.pk)  # the board redraws the run's row


def preempt_requeue(*, run: Run, hard: bool = False, now: datetime | None = None) -> bool:
    """Put a run being preempted back in the queue (its job ended, or `hard`: its grace period passed), its
    place granted to the waiting run in the same transaction. False when it has no open preemption or is no
    longer starting or running (then nothing is written: the caller finishes it as usual)."""
    if not Preemption.objects.filter(run_id=run.pk, ended_at__isnull=True).exists():
        return False  # the common case (any job's end asks): no lock taken
    now = now or timezone.now()
    with transaction.atomic():
        slot_store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run.pk)
        open_row = Preemption.objects.select_for_update().filter(run=locked, ended_at__isnull=True).last()
        if open_row is None or locked.status not in (RunStatus.STARTING, RunStatus.RUNNING):
            return False
        step, checkpoint = trained_step(locked), run_checkpoint_step(locked)
        lost = max(0, (step or 0) - (checkpoint or 0))
        outcome = PreemptOutcome.STOPPED_HARD if hard else PreemptOutcome.CHECKPOINTED
        open_row.ended_at, open_row.outcome, open_row.checkpoint_step, open_row.lost_steps = (
            now,
            outcome,
            checkpoint,
            lost,
        )
        open_row.save(update_fields=["ended_at", "outcome", "checkpoint_step", "lost_steps"])
        locked.preempt_state = PREEMPTED_STATE
        locked.save(update_fields=["preempt_state"])
        data = PreemptedData(
            by=open_row.preempted_by_id,
            outcome=outcome,
            step=step,
            checkpoint_step=checkpoint,
            lost_steps=lost,
            seconds=round((now - open_row.requested_at).total_seconds(), 3),
        )
        _event(locked, PREEMPTED, data, now)
        hook = PreemptedHookData(
            preempted_by=open_row.preempted_by_id,
            reason=open_row.reason,
            outcome=outcome,
            hard_stopped=hard,
            step=step,
            checkpoint_step=checkpoint,
            lost_steps=lost,
        )
        preempted_emit(run=locked, data=hook, at=now)
        words = "stopped hard after its grace period" if hard else "checkpointed and stopped"
        run_requeue(run=locked, reason=f"{locked.preempt_reason} ({words})", interrupted=True)
        if hard:  # the old attempt's job, by its id: Ray signals it again and kills it after its stop wait
            effects_store(stop := [StopJob(run_id=locked.pk, at=now, job=open_row.job)], now=now)
            effects_kick(stop)
    logger.info("run %s: preempted (%s), back in the queue; %s steps lost", run.pk, outcome, lost)
    return True


def preemptions_overdue(*, now: datetime | None = None) -> list[int]:
    """The tick: a victim still active past its deadline is requeued hard; an open preemption whose run ended
    otherwise (finished, cancelled) is closed. Returns the runs requeued hard."""
    now = now or timezone.now()
    hard: list[int] = []
    for row in list(Preemption.objects.filter(ended_at__isnull=True).select_related("run")):
        if row.run.status in (RunStatus.STARTING, RunStatus.RUNNING):
            if row.deadline_at <= now and preempt_requeue(run=row.run, hard=True, now=now):
                hard.append(row.run_id)
        elif row.run.status != RunStatus.STOPPING:  # finished, or queued by another way (a cancel waits)
            _close_ended(row, now)
    return hard


def _close_ended(row: Preemption, now: datetime) -> None:
    with transaction.atomic():
        if Preemption.objects.filter(pk=row.pk, ended_at__isnull=True).update(
            ended_at=now, outcome=PreemptOutcome.ENDED
        ):
            Run.objects.filter(pk=row.run_id, preempt_state=REQUESTED).update(preempt_state=ENDED)


def preempt_resumed(*, run: Run, now: datetime) -> None:
    """A preempted run's next attempt reports running (in the caller's transaction): its `resumed` event."""
    if run.preempt_state != PREEMPTED_STATE:
        return
    row = Preemption.objects.filter(run=run, ended_at__isnull=False, resumed_at__isnull=True).last()
    Run.objects.filter(pk=run.pk).update(preempt_state=RESUMED_STATE)
    run.preempt_state = RESUMED_STATE
    if row is None or row.ended_at is None:
        return
    row.resumed_at = now
    row.save(update_fields=["resumed_at"])
    waited = round((now - row.ended_at).total_seconds(), 3)
    _event(run, RESUMED, ResumedData(from_step=row.checkpoint_step, attempt=run.attempt, waited_seconds=waited), now)
