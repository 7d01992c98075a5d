"""The outbox table: one row per after-commit effect of a lifecycle move (runs/outbox/effects.py names the kinds).

Written in the move's transaction (runs/outbox/store.py: the ORM, or the move's own statement on PostgreSQL),
then only by the drainer (runs/outbox/drain.py): claimed for a lease, done, retried or given up. Rows are kept
once done, like the run's status events they follow: the record of what the platform did after each move."""

from __future__ import annotations

from django.db import models


class EffectState(models.TextChoices):
    PENDING = "pending"  # to do: due at next_attempt_at (claimed by a drainer until then, when `claim` is set)
    DONE = "done"  # done once (its task sent, or its database write committed with this mark)
    FAILED = "failed"  # given up after EFFECT_MAX_ATTEMPTS tries, or a payload that can never be done


class Effect(models.Model):
    kind = models.CharField(max_length=16)
    # What makes the effect itself: "<kind>:<run id>:<the move's time>". Storing a key twice keeps the first row.
    key = models.CharField(max_length=200, unique=True)
    payload = models.JSONField(default=dict)  # the kind's typed payload (runs/outbox/effects.py)
    state = models.CharField(max_length=8, choices=EffectState.choices, default=EffectState.PENDING)
    attempts = models.PositiveIntegerField(default=0)  # claims so far (each try counts, a crashed one too)
    next_attempt_at = models.DateTimeField()  # due from then; a claim moves it one lease ahead
    claim = models.CharField(max_length=32, blank=True, default="")  # the drain pass that holds it, if any
    last_error = models.TextField(blank=True, default="")
    outcome = models.CharField(max_length=200, blank=True, default="")  # what its task answered
    created_at = models.DateTimeField()
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        # The drainer's scan: pending rows only (few), by due time; done rows cost the index nothing.
        indexes = [
            models.Index(fields=["next_attempt_at"], condition=models.Q(state="pending"), name="outbox_effect_due_idx")
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.state})"
