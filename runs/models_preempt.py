"""A run's preemptions (docs/slots.md "Preemption"): one row per preemption, written by runs/execution/preempt.py
only. Open (`ended_at` null) from the request until the run is back in the queue; the rows of the last 24 hours
are what `max_preemptions_per_run_per_day` counts. Re-exported by runs.models."""

from __future__ import annotations

from django.db import models


class PreemptOutcome(models.TextChoices):
    CHECKPOINTED = "checkpointed"  # its job checkpointed and stopped within the grace period
    STOPPED_HARD = "stopped_hard"  # the grace period passed first: requeued, its job stopped; work since lost
    ENDED = "ended"  # the run ended otherwise first (finished, cancelled, failed): nothing to requeue


class Preemption(models.Model):
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="preemptions")  # the victim
    # The waiting run it made room for (null: that run was deleted since).
    preempted_by = models.ForeignKey("runs.Run", null=True, on_delete=models.SET_NULL, related_name="+")
    reason = models.CharField(max_length=300)
    requested_at = models.DateTimeField()
    deadline_at = models.DateTimeField()  # requested_at + the grace period: then it is stopped hard
    job = models.CharField(max_length=128, blank=True, default="")  # the job asked to stop (its submission id)
    step_at_request = models.IntegerField(null=True, blank=True)  # the latest trained step the platform knew
    ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=PreemptOutcome.choices, blank=True, default="")
    checkpoint_step = models.IntegerField(null=True, blank=True)  # the checkpoint it resumes from (None: step 0)
    lost_steps = models.IntegerField(null=True, blank=True)  # trained steps after that checkpoint, lost
    resumed_at = models.DateTimeField(null=True, blank=True)  # its next attempt reported running

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["run", "requested_at"], name="preempt_run_time_idx"),
            models.Index(fields=["deadline_at"], condition=models.Q(ended_at=None), name="preempt_open_idx"),
        ]
