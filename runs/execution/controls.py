"""Commands from staff to a running job: request (audited), delivery in ingest replies, acknowledgement.

The platform cannot call into a Ray job; the job already posts to the platform at least every few seconds
(events, heartbeats). So a command is a `RunControl` row that each ingest reply carries (`commands`) until the
job answers with a `control` event naming its id (applied, or refused with a reason). The row is the audit
record; the request and the job's answer also appear in the run's event stream (`log` from the platform,
`control` from the job). Kinds: `gate_reset`, for a run whose gate is poisoned (trainer/controls.py).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs.audit.models import Action
from runs.audit.record import Actor, actor_of, audit_record
from runs.core.events import PLATFORM_SOURCE, run_events_record
from runs.core.stores import run_events_publish
from runs.errors import InvalidInput, InvalidTransition, NotAllowed
from runs.models import Run, RunControl, RunEvent, RunStatus
from trainer.events import ControlCommand

audit = logging.getLogger("runs.audit")

REASON_MAX = 500
# Commands waiting for the job's answer, per run: a stuck job cannot make the queue grow without bound.
PENDING_MAX = 4


def run_gate_reset(*, run: Run, by: Any, reason: Any, actor: Actor | None = None) -> RunControl:
    """Staff ask the run's job to reset its poisoned gate; the job re-checks engine versions first. Audited as
    `actor` (default `by`) with the command."""
    if not getattr(by, "is_staff", False):
        raise NotAllowed("only staff may reset a run's gate")
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("say why the gate may be reset (what happened to the unknown requests)", field="reason")
    reason = reason.strip()
    if len(reason) > REASON_MAX:
        raise InvalidInput(f"at most {REASON_MAX} characters", field="reason")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status != RunStatus.RUNNING:
            raise InvalidTransition(f"run {run.pk} is {locked.status}: only a running job can reset its gate")
        gate = (locked.summary or {}).get("gate") or {}
        if gate.get("state") != "poisoned":
            raise InvalidTransition(
                f"run {run.pk}'s gate is {gate.get('state') or 'unknown'}, not poisoned: nothing to reset", field="gate"
            )
        if RunControl.objects.filter(run=locked, acked_at__isnull=True).count() >= PENDING_MAX:
            raise InvalidTransition(f"run {run.pk} already has {PENDING_MAX} commands waiting for its job")
        control = RunControl.objects.create(run=locked, kind="gate_reset", reason=reason, requested_by=by)
        after = {"control": control.pk, "reason": reason}
        audit_record(actor or actor_of(by), Action.GATE_RESET, target_type="run", target_id=locked.pk, after=after)
        stored = run_events_record(
            run=locked,
            source=PLATFORM_SOURCE,
            events=[
                {
                    "type": "log",
                    "ts": timezone.now(),
                    "data": {
                        "level": "warning",
                        "message": f"gate reset requested by {by.get_username()}: {reason}",
                        "control": control.pk,
                    },
                }
            ],
        )
        transaction.on_commit(lambda: run_events_publish(stored))
    audit.warning("run %s gate_reset #%s requested by %s: %s", run.pk, control.pk, by.get_username(), reason)
    return control


def controls_pending(*, run_id: int) -> list[ControlCommand]:
    """What the next ingest reply carries: the run's unanswered commands, oldest first (marked delivered)."""
    rows = list(
        RunControl.objects.filter(run_id=run_id, acked_at__isnull=True).select_related("requested_by")[:PENDING_MAX]
    )
    if not rows:
        return []
    RunControl.objects.filter(pk__in=[r.pk for r in rows], delivered_at__isnull=True).update(
        delivered_at=timezone.now()
    )
    return [
        ControlCommand(id=r.pk, kind=r.kind, reason=r.reason, requested_by=r.requested_by.get_username()) for r in rows
    ]


def controls_ack(*, run_id: int, stored: list[RunEvent]) -> None:
    """The job's `control` events answer commands of this run (an unknown or foreign id is ignored)."""
    for event in stored:
        if event.type != "control":
            continue
        data = event.data
        RunControl.objects.filter(pk=data["id"], run_id=run_id, acked_at__isnull=True).update(
            acked_at=timezone.now(), outcome=str(data["outcome"])[:16], detail=str(data.get("detail") or "")[:500]
        )
        audit.warning("run %s control #%s %s: %s", run_id, data["id"], data["outcome"], data.get("detail") or "")
