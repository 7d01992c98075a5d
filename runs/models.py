"""Tables of the control plane: runs, their events, the slot queue, concurrency settings and schedules (a run's
preemptions and its captured samples are in runs/models_preempt.py and runs/models_samples.py)."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.utils.crypto import constant_time_compare

from runs.auth.run_keys import ingest_token_derive, new_ingest_nonce, serving_key_derive


class RunStatus(models.TextChoices):
    QUEUED = "queued"  # waiting for a slot
    STARTING = "starting"  # slot granted, launching
    RUNNING = "running"
    STOPPING = "stopping"  # cancel requested
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_STATUSES = (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.STOPPING)
FINISHED_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


class RunClass(models.TextChoices):
    INTERACTIVE = "interactive"
    APP = "app"
    SCHEDULE = "schedule"
    SYSTEM = "system"


class Origin(models.TextChoices):
    DASHBOARD = "dashboard"
    API = "api"
    SCHEDULE = "schedule"
    SYSTEM = "system"


ORIGIN_TO_CLASS: dict[str, str] = {
    Origin.DASHBOARD: RunClass.INTERACTIVE,
    Origin.API: RunClass.APP,
    Origin.SCHEDULE: RunClass.SCHEDULE,
    Origin.SYSTEM: RunClass.SYSTEM,
}


def new_ingest_token() -> str:
    """Kept for migration 0001, which names it as the default of the (since removed) plaintext column."""
    return secrets.token_urlsafe(32)


class Run(models.Model):
    name = models.CharField(max_length=200)
    origin = models.CharField(max_length=16, choices=Origin.choices)
    run_class = models.CharField(max_length=16, choices=RunClass.choices)
    kind = models.CharField(max_length=64)
    # No single-column indexes on status and owner: (status, -finished_at) and (owner, -id) below lead with them,
    # and every index is written on each status move (a status move is not a HOT update).
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="runs", db_index=False)
    config = models.JSONField(default=dict)

    created_at = models.DateTimeField(auto_now_add=True)
    granted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    time_limit_seconds = models.PositiveIntegerField(null=True, blank=True)

    error = models.TextField(blank=True, default="")
    # What the run asks the cluster for, fixed at submit from its kind and config (trainer/resources.py):
    # {"bundles": [{"role", "CPU", "GPU", "memory"}, ...], "total": {...}, "strategy": "PACK"}.
    resources = models.JSONField(default=dict)
    # Why a granted run is not running yet (`waiting_for_resources` while its placement group is pending,
    # `starting_processes` once it is ready and the processes start),
    # with a short human detail; empty otherwise. Queued runs' reasons are computed (runs/selectors.py).
    pending_reason = models.CharField(max_length=32, blank=True, default="")
    pending_detail = models.CharField(max_length=300, blank=True, default="")
    # Latest gate state, weight version, sampler progress and metrics, folded from the run's events.
    summary = models.JSONField(default=dict)

    # Execution: the Ray job that runs it, the token its events authenticate with, the last stored event seq.
    ray_submission_id = models.CharField(max_length=128, blank=True, default="")
    # Per-run random input of the ingest token (see ingest_token_derive); not a secret on its own.
    ingest_nonce = models.CharField(max_length=64, default=new_ingest_nonce)
    last_seq = models.BigIntegerField(default=0)
    # Where the current attempt's session server listens (its `serving` event, host vetted: runs/execution/serving.py);
    # cleared by every move that ends or replaces the attempt (runs.core.lifecycle.stamp). Never in an API answer.
    serving_url = models.CharField(max_length=256, blank=True, default="")
    attempt = models.PositiveIntegerField(default=0)
    resume_requested = models.BooleanField(default=False)
    auto_resume = models.BooleanField(default=False)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    # Its latest preemption (written only by runs/execution/preempt.py; the history is runs.models_preempt):
    # `preempt_state` "" (never), requested (checkpointing and stopping), preempted (back in the queue), resumed,
    # ended (it finished or was cancelled before its preemption completed).
    preempted_by = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    preempt_state = models.CharField(max_length=16, blank=True, default="")
    preempt_reason = models.CharField(max_length=300, blank=True, default="")
    # Not a column: the status a run had before a finish moved it, set only on the Run that RunStore.finish
    # returns (runs/core/stores.py, runs/slots/pg.py); reading it on any other instance raises AttributeError.
    previous_status: str

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["owner", "-id"]),
            models.Index(fields=["run_class", "status"]),
            # Recent grant rate for queue ETAs.
            models.Index(fields=["granted_at"], name="run_granted_at_idx"),
            # The latest finished runs: a typical run's duration, a kind's pace profiles (runs/scheduling/finishes.py).
            models.Index(fields=["status", "-finished_at"], name="run_status_finished_idx"),
            models.Index(fields=["kind", "status", "-finished_at"], name="run_kind_finished_idx"),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.name}, {self.status})"

    @property
    def ingest_token(self) -> str:
        """The current attempt's ingest token (derived on demand; what the launcher gives the job)."""
        return ingest_token_derive(run_id=self.pk, attempt=self.attempt, nonce=self.ingest_nonce)

    def serving_keys(self) -> list[str]:
        """The current attempt's serving key under SECRET_KEY, then under each of SECRET_KEY_FALLBACKS (a job
        launched before a key rotation holds one of those: the proxy tries them in order)."""
        return [
            serving_key_derive(run_id=self.pk, attempt=self.attempt, nonce=self.ingest_nonce, secret=secret)
            for secret in [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]
        ]

    def ingest_token_matches(self, token: str) -> bool:
        """Constant-time check of a presented token against the current attempt's, under SECRET_KEY and each of
        SECRET_KEY_FALLBACKS (so a key rotation does not cut off running jobs)."""
        presented = token.encode("utf-8", "replace")
        ok = False
        for secret in [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]:
            expected = ingest_token_derive(run_id=self.pk, attempt=self.attempt, nonce=self.ingest_nonce, secret=secret)
            ok |= constant_time_compare(presented, expected.encode())
        return ok


class RunEvent(models.Model):
    """One event of a run's stream. `seq` is the platform's per-run order (strictly increasing, no gaps);
    (run, source, source_seq) is the emitter's idempotency key, so a re-posted batch is stored once.
    `source` is "platform" for status changes or "attempt-<n>" for the n-th launch of the run's job."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.BigIntegerField()
    source = models.CharField(max_length=32, default="platform")
    source_seq = models.BigIntegerField(null=True, blank=True)
    ts = models.DateTimeField()
    type = models.CharField(max_length=24)
    data = models.JSONField(default=dict)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="runevent_run_seq_unique"),
            models.UniqueConstraint(fields=["run", "source", "source_seq"], name="runevent_source_seq_unique"),
        ]
        # One type of one run in order (charts, comparison, trace export, summaries) without reading the rest.
        indexes = [models.Index(fields=["run", "type", "seq"], name="runevent_run_type_seq_idx")]
        ordering = ["run", "seq"]


class RunControl(models.Model):
    """A command from staff to a running job, and its audit record: who asked, why, when, and what the job did.

    Delivered in the job's ingest replies until the job acknowledges it with a `control` event
    (runs/execution/controls.py; trainer/controls.py applies it). Kinds: `gate_reset` (clear a poisoned gate)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="controls")
    kind = models.CharField(max_length=16)
    reason = models.CharField(max_length=500)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)  # first sent in an ingest reply
    acked_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True, default="")  # applied | refused (by the job)
    detail = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["run", "acked_at"])]


class SlotState(models.TextChoices):
    WAITING = "waiting"
    HELD = "held"


class Slot(models.Model):
    """A run's place in the slot queue: `waiting` until granted, `held` while it runs; deleted on release. Kept
    apart from Run so that grant queries touch a narrow, well-indexed table whatever the run history."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="slot")
    run_class = models.CharField(max_length=16, choices=RunClass.choices)
    state = models.CharField(max_length=8, choices=SlotState.choices, default=SlotState.WAITING)
    requested_at = models.DateTimeField()
    granted_at = models.DateTimeField(null=True, blank=True)
    # The run's bundles (Ray JSON), copied from Run.resources at enqueue so grants read one narrow table; `placement`
    # is each bundle's node once held (the grant's packing, then where Ray really placed it when the job reports it).
    demand = models.JSONField(default=list)
    strategy = models.CharField(max_length=16, default="PACK")
    placement = models.JSONField(default=list)
    time_limit_seconds = models.PositiveIntegerField(null=True, blank=True)  # backfill: latest end = granted_at + this
    # The run's owner (copied at enqueue; 0: none given): fair share seeks each owner's heads (docs/slots.md).
    owner_id = models.IntegerField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["state", "run_class", "requested_at", "run"], name="slot_queue_idx"),
            models.Index(fields=["state", "run_class", "owner_id", "requested_at", "run"], name="slot_owner_idx"),
        ]


class ClusterNode(models.Model):
    """A Ray node as the tick last read it (runs/execution/capacity.py): its total resources (Ray JSON) and
    whether Ray reports it alive. Admission charges held runs' bundles against these totals."""

    node_id = models.CharField(max_length=64, unique=True)
    address = models.CharField(max_length=128, blank=True, default="")
    alive = models.BooleanField(default=True)
    total = models.JSONField(default=dict)
    seen_at = models.DateTimeField()


class ClusterStatus(models.Model):
    """One row: whether the last read of Ray succeeded, when, and what failed (the board shows it)."""

    reachable = models.BooleanField(default=False)
    checked_at = models.DateTimeField(null=True, blank=True)
    message = models.TextField(blank=True, default="")
    # When the current reachable stretch began (the first read, or the first after an outage); null while
    # unreachable. A launch timeout counts from here when the run was granted before it: an outage is not the run's.
    reachable_since = models.DateTimeField(null=True, blank=True)


class ConcurrencySettings(models.Model):
    """The stored, raw concurrency settings (one row). Effective values are computed, never stored."""

    raw = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)


class Schedule(models.Model):
    """A cron schedule that submits runs with origin `schedule`."""

    name = models.CharField(max_length=200)
    cron = models.CharField(max_length=100)
    kind = models.CharField(max_length=64)
    config = models.JSONField(default=dict)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="schedules")
    enabled = models.BooleanField(default=True)
    next_run_at = models.DateTimeField(null=True, blank=True)
    last_run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)


# Tables in modules of their own (each by what it records), re-exported: Django finds a model through `runs.models`.
from runs.models_preempt import Preemption as Preemption  # noqa: E402
from runs.models_samples import Sample as Sample  # noqa: E402
