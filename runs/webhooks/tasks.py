"""The webhook tasks the outbox's effects name (runs/outbox/effects.py): `deliver` (a worker's: POST one
delivery, retried by Celery until accepted) and `status_fanout` (run by the drainer in its own transaction: a
finish's deliveries, runs/webhooks/emit.py).

At least once: each try is an Attempt row (time, status code or error, latency); a 2xx marks the delivery
delivered, anything else retries after WEBHOOKS_RETRY_BASE_MS doubling per attempt, capped at
WEBHOOKS_RETRY_MAX_S, for WEBHOOKS_MAX_ATTEMPTS attempts in all. The target is checked again (the SSRF rule,
runs/webhooks/targets.py) at every attempt and the POST connects to the address checked; a refused target fails
the delivery at once. A delivered (or deleted) delivery is never sent again, so a message sent twice (the
drainer's crash window) POSTs once more at most, with the same X-RLCP-Delivery for the receiver to drop it."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db.models import F
from django.utils import timezone

from runs.outbox import effects
from runs.webhooks import emit
from runs.webhooks.models import Attempt, Delivery, DeliveryState
from runs.webhooks.send import Answer, body_encode, post
from runs.webhooks.targets import TargetRefused, target_resolve

logger = logging.getLogger(__name__)


def retry_delay_s(attempt: int) -> float:
    """Seconds before attempt `attempt + 1` (attempt counts from 1)."""
    return min(settings.WEBHOOKS_RETRY_BASE_MS / 1000 * 2 ** (attempt - 1), settings.WEBHOOKS_RETRY_MAX_S)


def deliver_once(delivery_id: str) -> tuple[str, int]:
    """One attempt: (outcome, attempts so far). Outcome: `delivered`, `retry`, `failed` or `skipped`."""
    delivery = Delivery.objects.select_related("subscription__owner").filter(pk=delivery_id).first()
    if delivery is None or delivery.state != DeliveryState.PENDING:
        return "skipped", 0
    sub = delivery.subscription
    allow = settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS or (sub.allow_private and sub.owner.is_staff)
    Delivery.objects.filter(pk=delivery.pk).update(attempts=F("attempts") + 1)
    attempts = delivery.attempts + 1
    now = timezone.now()
    try:
        target = target_resolve(sub.url, allow_private=allow)
    except TargetRefused as exc:
        answer = Answer(None, f"target refused: {exc}"[:300], 0.0)
    else:
        body = body_encode(
            delivery_id=str(delivery.pk),
            event=delivery.event,
            run=delivery.run_id,
            at=delivery.at.timestamp(),
            data=delivery.data,
        )
        answer = post(target, secret=sub.secret, delivery_id=str(delivery.pk), body=body)
    Attempt.objects.create(
        delivery=delivery, at=now, status_code=answer.status_code, error=answer.error, latency_ms=answer.latency_ms
    )
    if answer.accepted:
        Delivery.objects.filter(pk=delivery.pk).update(state=DeliveryState.DELIVERED, delivered_at=timezone.now())
        return "delivered", attempts
    if answer.error.startswith("target refused") or attempts >= settings.WEBHOOKS_MAX_ATTEMPTS:
        Delivery.objects.filter(pk=delivery.pk).update(state=DeliveryState.FAILED)
        logger.warning("webhook delivery %s to subscription %s failed: %s", delivery.pk, sub.pk, answer.error)
        return "failed", attempts
    return "retry", attempts


@shared_task(bind=True, name=effects.TASK_WEBHOOK, max_retries=None, acks_late=True)
def deliver(self: Any, delivery_id: str) -> str:
    outcome, attempts = deliver_once(delivery_id)
    if outcome == "retry":
        raise self.retry(countdown=retry_delay_s(attempts))
    return outcome


@shared_task(name=effects.TASK_WEBHOOK_STATUS)
def status_fanout(run_id: int, at: str) -> str:
    return emit.status_fanout(run_id, at)
