"""Cancel: the one move a user asks of a run that is not a submit or resume (runs/core/lifecycle.py has the
moves it is made of). A queued run is cancelled at once and its slot removed; an active one goes `stopping`,
and the stop of its job is an outbox effect of that move; a stopping run is left as it is. The cancel is
audited with the move, in its transaction (runs/audit/).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from runs.audit.models import Action
from runs.audit.record import actor_of, audit_record
from runs.core.lifecycle import run_finish, run_status_change
from runs.errors import InvalidTransition
from runs.models import Run, RunStatus
from runs.outbox.effects import StopJob
from runs.outbox.store import effects_kick, effects_store
from runs.slots import store as slot_store


def run_cancel(*, run: Run, by: Any) -> Run:
    """Queued: cancelled at once and its slot removed. Active: `stopping`; the launcher ends the job. `by`: an
    Actor, a user or the platform, audited with the move (a repeated cancel of a stopping run writes nothing)."""
    actor = actor_of(by)
    with transaction.atomic():
        slot_store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run.pk)
        before = {"status": locked.status}
        if locked.status == RunStatus.QUEUED:
            locked = run_finish(run=locked, status=RunStatus.CANCELLED, error=f"cancelled by {actor.name}")
        elif locked.status in (RunStatus.STARTING, RunStatus.RUNNING):
            now = timezone.now()
            run_status_change(run=locked, status=RunStatus.STOPPING, error=f"cancel requested by {actor.name}", now=now)
            effects_store(stop := [StopJob(run_id=locked.pk, at=now, job=locked.ray_submission_id)], now=now)
            effects_kick(stop)
        elif locked.status != RunStatus.STOPPING:
            raise InvalidTransition(f"run {run.pk} is already {locked.status}", field="status")
        if locked.status != before["status"]:
            after = {"status": locked.status}
            audit_record(actor, Action.RUN_CANCEL, target_type="run", target_id=locked.pk, before=before, after=after)
        return locked
