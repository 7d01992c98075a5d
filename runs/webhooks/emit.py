"""Which subscriptions an event of a run is told to, and storing their deliveries: one Delivery row and one outbox
effect (runs/outbox/effects.py `Webhook`) per subscription, in the transaction that writes the event, so an
event is told exactly when it is committed; the drainer sends each effect to the delivery task after the commit.

Callers: ingest (runs/telemetry/ingest.py: the job's events and the metric rules, under the run's row lock),
runs.core.lifecycle (status moves: `run_status_change` here at once; a grant or a finish, which PostgreSQL may
write in one statement of its own, through a `WebhookStatus` effect stored with the move: `status_fanout` runs
it in the drainer's transaction), preemption (runs/execution/preempt.py: `preempted_emit` in the transaction that
puts the victim back in the queue) and the API's "send test"."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypedDict

from django.db import transaction
from django.db.models import Q

from runs.models import Run, RunEvent
from runs.outbox.effects import Webhook, WebhookStatus
from runs.outbox.store import effects_kick, effects_store
from runs.webhooks.models import Delivery, EventKind, Subscription
from runs.webhooks.rules import rules_apply


def subscriptions_of(run_id: int, owner_id: int) -> list[Subscription]:
    """The active subscriptions whose scope covers the run: its owner's (all their runs, or this one) and staff
    ones for all runs or for this run."""
    scope = Q(run_id=run_id) | Q(run__isnull=True, owner_id=owner_id) | Q(run__isnull=True, all_runs=True)
    return list(Subscription.objects.filter(scope, active=True).prefetch_related("rules"))


def deliveries_store(
    subscriptions: Iterable[Subscription], *, event: str, run_id: int | None, data: Any, at: datetime
) -> list[Delivery]:
    """A delivery and its effect per subscription, in the current transaction; drained after its commit."""
    rows = [Delivery(subscription=s, run_id=run_id, event=event, data=data, at=at) for s in subscriptions]
    if not rows:
        return []
    with transaction.atomic():
        Delivery.objects.bulk_create(rows)
        effects = [Webhook(run_id=run_id or 0, at=at, delivery=str(row.id)) for row in rows]
        effects_store(effects, now=at)
        effects_kick(effects)
    return rows


def _told(subscription: Subscription, event: str) -> bool:
    return event in subscription.events


def job_event_kind(event: RunEvent) -> str | None:
    """The webhook event a stored job event is, if any."""
    data = event.data if isinstance(event.data, dict) else {}
    if event.type == "gate" and data.get("state") == "poisoned":
        return EventKind.GATE_POISONED
    if event.type == "checkpoint" and data.get("state") == "saved":
        return EventKind.CHECKPOINT
    if event.type == "log" and isinstance(data.get("eval"), dict):
        return EventKind.EVALUATION
    return None


def ingest_emit(*, run: Run, stored: list[RunEvent]) -> int:
    """Deliveries for a stored batch (in its transaction, under the run's row lock): its job events that are
    webhook events, and the rules its train events cross (runs/webhooks/rules.py). Returns deliveries stored."""
    if not stored:
        return 0
    subscriptions = subscriptions_of(run.pk, run.owner_id)
    if not subscriptions:
        return 0
    told = 0
    for event in stored:
        kind = job_event_kind(event)
        if kind is not None:
            subs = [s for s in subscriptions if _told(s, kind)]
            data = {"type": event.type, "seq": event.seq, **event.data}
            told += len(deliveries_store(subs, event=kind, run_id=run.pk, data=data, at=event.ts))
    for subscription, data, at in rules_apply(run_id=run.pk, subscriptions=subscriptions, stored=stored):
        told += len(deliveries_store([subscription], event=EventKind.METRIC, run_id=run.pk, data=data, at=at))
    return told


def status_emit(*, run: Run, status: str, previous: str | None, error: str, at: datetime) -> int:
    """Deliveries of a status move, in its transaction."""
    subs = [s for s in subscriptions_of(run.pk, run.owner_id) if _told(s, EventKind.STATUS)]
    data = {"status": status, "previous": previous, "error": error}
    return len(deliveries_store(subs, event=EventKind.STATUS, run_id=run.pk, data=data, at=at))


class PreemptedHookData(TypedDict):
    """`run.preempted`'s `data` (the body's `run` is the victim): told once per preemption, when the victim is
    back in the queue."""

    preempted_by: int | None  # the waiting run it made room for (None: deleted since)
    reason: str
    outcome: str  # checkpointed (stopped within its grace period) | stopped_hard (the grace period passed first)
    hard_stopped: bool  # outcome == stopped_hard
    step: int | None  # the latest trained step the platform knew when it stopped
    checkpoint_step: int | None  # where it resumes (None: no checkpoint known, from step 0)
    lost_steps: int  # trained steps after that checkpoint: the work lost (0 when it checkpointed in time)


def preempted_emit(*, run: Run, data: PreemptedHookData, at: datetime) -> int:
    """Deliveries of a preemption, in the transaction that records the victim preempted."""
    subs = [s for s in subscriptions_of(run.pk, run.owner_id) if _told(s, EventKind.PREEMPTED)]
    return len(deliveries_store(subs, event=EventKind.PREEMPTED, run_id=run.pk, data=data, at=at))


def finish_webhooks(run: Run, now: datetime) -> list[WebhookStatus]:
    """The effect that tells a finish (stored with the move), when any subscription would be told of it."""
    subs = subscriptions_of(run.pk, run.owner_id)
    return [WebhookStatus(run_id=run.pk, at=now)] if any(_told(s, EventKind.STATUS) for s in subs) else []


def grant_webhooks(run_ids: list[int], now: datetime) -> list[WebhookStatus]:
    """The effects that tell a grant pass's moves to `starting` (stored with them), when any subscription that
    covers one of the runs is told of moves (one query; `status_fanout` then finds each run's own)."""
    if not run_ids:
        return []
    owners = Run.objects.filter(pk__in=run_ids).values("owner_id")
    scope = Q(run_id__in=run_ids) | Q(run__isnull=True, owner_id__in=owners) | Q(run__isnull=True, all_runs=True)
    events = Subscription.objects.filter(scope, active=True).values_list("events", flat=True)
    if not any(EventKind.STATUS in told for told in events):
        return []
    return [WebhookStatus(run_id=run_id, at=now) for run_id in run_ids]


def status_fanout(run_id: int, at: str) -> str:
    """The `WebhookStatus` effect's body, in the drainer's transaction: the move's deliveries, from its `status`
    event (the run's status now may be a later one), or the run's row if that event is gone."""
    moment = datetime.fromisoformat(at)
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return "no such run"
    event = (
        RunEvent.objects.filter(run_id=run_id, type="status", ts=moment).order_by("-seq").values_list("data").first()
    )
    data = event[0] if event else {"status": run.status, "previous": run.previous_status, "error": run.error}
    subs = [s for s in subscriptions_of(run.pk, run.owner_id) if _told(s, EventKind.STATUS)]
    rows = deliveries_store(subs, event=EventKind.STATUS, run_id=run.pk, data=data, at=moment)
    return f"{len(rows)} deliveries"
