"""One row per state-changing call, never changed afterwards: time, actor (a user, with the API token's prefix
when the call came with one, or the platform), action, target, request id and the values before and after.

Append-only is enforced here, not by convention: saving an existing row, deleting one, and a queryset's update
or delete all raise `AuditImmutable`. There are no foreign keys: deleting a user or a run must neither cascade
into the log nor rewrite it (SET_NULL would be an update), so a row keeps the user id and the username it had.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone


class AuditImmutable(Exception):
    """An attempt to change or delete an audit row."""


class Action(models.TextChoices):
    RUN_SUBMIT = "run.submit"
    RUN_CANCEL = "run.cancel"
    RUN_RESUME = "run.resume"
    # The platform put a starting or running run back in the queue (placement timeout, restart recovery).
    RUN_REQUEUE = "run.requeue"
    # runs/execution/preempt.py: a run asked to checkpoint and stop for a waiting run of higher priority.
    RUN_PREEMPT = "run.preempt"
    GATE_RESET = "gate.reset"
    SETTINGS_CONCURRENCY = "settings.concurrency"
    SCHEDULE_CREATE = "schedule.create"
    SCHEDULE_UPDATE = "schedule.update"
    SCHEDULE_DELETE = "schedule.delete"
    TOKEN_CREATE = "token.create"
    TOKEN_REVOKE = "token.revoke"


PLATFORM = "platform"  # the actor name of automatic actions (scheduler, auto-resume, requeue, restart recovery)


class AuditQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        raise AuditImmutable("audit rows cannot be updated")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AuditImmutable("audit rows cannot be deleted")


class AuditEntry(models.Model):
    at = models.DateTimeField(default=timezone.now)
    actor_user_id = models.BigIntegerField(null=True)  # null for the platform
    actor_name = models.CharField(max_length=150)  # the username at the time, or "platform"
    actor_token = models.CharField(max_length=16, blank=True)  # the API token's prefix (never the secret), or ""
    action = models.CharField(max_length=32, choices=Action.choices)
    target_type = models.CharField(max_length=32)  # "run", "schedule", "settings", "token"
    target_id = models.CharField(max_length=64)
    request_id = models.CharField(max_length=64, blank=True)  # "" for actions with no request
    before = models.JSONField(null=True)
    after = models.JSONField(null=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["-at", "-id"], name="audit_newest_idx"),
            models.Index(fields=["target_type", "target_id", "action"], name="audit_target_idx"),
            models.Index(fields=["actor_user_id", "-at"], name="audit_actor_idx"),
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AuditImmutable("audit rows cannot be updated")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AuditImmutable("audit rows cannot be deleted")

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.target_type}:{self.target_id}"
