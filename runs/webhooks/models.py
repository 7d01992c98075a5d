"""The webhook tables: subscriptions (who is told what, where), their metric rules and each rule's per-run state,
and the delivery log (one row per event told, one attempt row per POST).

Writers: the API (runs/api/webhooks.py) writes subscriptions and rules; runs/webhooks/emit.py, in the event's
transaction, writes deliveries and rule states; the delivery task (runs/webhooks/tasks.py) writes attempts and a
delivery's outcome."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class EventKind(models.TextChoices):
    STATUS = "run.status"  # every lifecycle move of the run (its `status` event)
    GATE_POISONED = "run.gate_poisoned"  # the job's `gate` event with state `poisoned`
    CHECKPOINT = "run.checkpoint"  # the job's `checkpoint` event with state `saved`
    EVALUATION = "run.evaluation"  # an eval job's `log` event carrying its `eval` metrics
    PREEMPTED = "run.preempted"  # the run was preempted and is back in the queue (runs/execution/preempt.py)
    METRIC = "metric.alert"  # one of the subscription's metric rules crossed its threshold
    TEST = "test"  # "send test" (POST /api/webhooks/<id>/test/); needs no subscription to it


class Subscription(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhooks")
    url = models.CharField(max_length=2048)
    events = models.JSONField(default=list)  # EventKind values (not `test`)
    # One run (the owner's, or any for staff) or, null: all the owner's runs (all runs for a staff owner).
    run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    all_runs = models.BooleanField(default=False)  # staff only: every run, not only the owner's
    secret = models.CharField(max_length=64)  # the HMAC key; shown once, at creation
    allow_private = models.BooleanField(default=False)  # staff only: a private/loopback target is allowed
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"webhook {self.pk} of {self.owner_id}"


class MetricRule(models.Model):
    """`metric` (a train event's field) `above`/`below` `threshold`, or a relative `drop` of at least `threshold`
    (0.2: 20 %) from the highest of the last `window` values to the newest."""

    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="rules")
    metric = models.CharField(max_length=32)
    op = models.CharField(max_length=8)
    threshold = models.FloatField()
    window = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["id"]


class RuleState(models.Model):
    """A rule on one run: crossed or not (it fires when it becomes crossed, re-arms when it uncrosses), and the
    recent values a `drop` compares."""

    rule = models.ForeignKey(MetricRule, on_delete=models.CASCADE, related_name="states")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    crossed = models.BooleanField(default=False)
    recent = models.JSONField(default=list)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["rule", "run"], name="webhooks_rulestate_rule_run")]


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"  # a 2xx answer
    FAILED = "failed"  # given up after WEBHOOKS_MAX_ATTEMPTS, or its target refused (SSRF rule)


class Delivery(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4)  # X-RLCP-Delivery: the same on every attempt
    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="deliveries")
    run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    event = models.CharField(max_length=32)
    data = models.JSONField(default=dict)
    at = models.DateTimeField()  # when the event happened (committed with this row)
    state = models.CharField(max_length=10, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["subscription", "-at"], name="webhooks_delivery_sub_at")]


class Attempt(models.Model):
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    at = models.DateTimeField()
    status_code = models.PositiveIntegerField(null=True, blank=True)  # null: no answer (see error)
    error = models.CharField(max_length=300, blank=True, default="")
    latency_ms = models.FloatField()

    class Meta:
        ordering = ["id"]
