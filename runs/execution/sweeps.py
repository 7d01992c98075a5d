"""The tick's sweeps over active runs: reclaim runs whose job stopped heartbeating (confirmed against Ray)
and fail runs past their time limit (whether Ray is reachable or not). Each failure goes through
runs.core.lifecycle.run_finish (so follow-ups such as auto-resume apply) and asks the launcher to stop the job."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from runs.core.lifecycle import run_finish
from runs.execution.ray import submission_id_for
from runs.models import ACTIVE_STATUSES, Run, RunStatus
from runs.scheduling import limits
from runs.slots import store as slot_store

# Ray job statuses of a job that is still going (a stale heartbeat then waits for the hard timeout).
ALIVE_JOB_STATUSES = frozenset({"PENDING", "RUNNING"})


def _fail_active(run_ids: list[int], *, error_of: Callable[[Run], str]) -> list[int]:
    """Fail each still-active run (one transaction each, so one bad row cannot block the sweep)."""
    failed: list[int] = []
    for run_id in run_ids:
        with transaction.atomic():
            slot_store.slots_lock()
            locked = Run.objects.select_for_update().get(pk=run_id)
            if locked.status not in ACTIVE_STATUSES:
                continue
            run_finish(run=locked, status=RunStatus.FAILED, error=error_of(locked), stop_job=True)
            failed.append(run_id)
    return failed


def runs_reclaim_stale(*, now: datetime, jobs: Mapping[int, str | None] | None) -> list[int]:
    """Fail `running` / `stopping` runs whose job stopped heartbeating, once Ray confirms it (`jobs`: Ray's
    status of each observed run's current job, None for a job Ray does not know; `jobs` None: Ray is not
    reachable, and nothing is failed). A heartbeat is any accepted ingest post (runs/telemetry/ingest.py). A job that
    ended is the reconcile's (its real outcome); a job Ray no longer knows fails the run at once; a job Ray
    still reports running fails it only after SLOTS_HEARTBEAT_HARD_TIMEOUT_SECONDS. `starting` runs are not
    looked at here: their liveness is their job's status (runs/execution/liveness.py)."""
    if jobs is None:
        return []
    timeout, hard = settings.SLOTS_HEARTBEAT_TIMEOUT_SECONDS, settings.SLOTS_HEARTBEAT_HARD_TIMEOUT_SECONDS
    cutoff = now - timedelta(seconds=timeout)
    stale = Run.objects.filter(status__in=(RunStatus.RUNNING, RunStatus.STOPPING)).filter(
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, granted_at__lt=cutoff)
    )
    reasons: dict[int, str] = {}
    for run in list(stale.only("pk", "heartbeat_at", "granted_at", "ray_submission_id", "attempt")):
        last = run.heartbeat_at or run.granted_at
        silent = int((now - last).total_seconds()) if last else timeout
        status = jobs.get(run.pk) if run.ray_submission_id == submission_id_for(run) else None
        if status is None:
            job = run.ray_submission_id or "(never submitted)"
            reasons[run.pk] = f"heartbeat lost and Ray no longer knows job {job} (no heartbeat for {silent} s)"
        elif status in ALIVE_JOB_STATUSES and silent > hard:
            reasons[run.pk] = f"heartbeat lost for {silent} s while Ray reports the job {status.lower()}"
    return _fail_active(list(reasons), error_of=lambda r: reasons[r.pk])


def runs_enforce_time_limits(*, now: datetime) -> list[int]:
    """Fail active runs past their time limit, counted from the grant (time queued never counts). A run stored
    without a limit (submitted before limits were mandatory) gets the current staff default."""
    default = limits.limits_load().default_time_limit_seconds
    over = [
        r.pk
        for r in Run.objects.filter(status__in=ACTIVE_STATUSES, granted_at__isnull=False).only(
            "pk", "granted_at", "time_limit_seconds"
        )
        if r.granted_at is not None  # the filter excludes null; narrows the type
        and r.granted_at + timedelta(seconds=r.time_limit_seconds or default) <= now
    ]
    return _fail_active(over, error_of=lambda r: f"time limit of {r.time_limit_seconds or default} s exceeded")
