"""The tick's sweeps over active runs: reclaim runs whose job stopped heartbeating and fail runs past their
time limit. Each failure goes through runs.lifecycle.run_finish (so follow-ups such as auto-resume apply) and
asks the launcher to stop the job."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from runs import limits
from runs.lifecycle import run_finish
from runs.models import ACTIVE_STATUSES, Run, RunStatus
from runs.slots import store as slot_store


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


def runs_reclaim_stale(*, now: datetime) -> list[int]:
    """Fail active runs whose executor stopped heartbeating (never heartbeated: counted from the grant).
    A heartbeat is any accepted ingest post (runs/ingest.py)."""
    timeout = settings.SLOTS_HEARTBEAT_TIMEOUT_SECONDS
    cutoff = now - timedelta(seconds=timeout)
    stale = Run.objects.filter(status__in=ACTIVE_STATUSES).filter(
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, granted_at__lt=cutoff)
    )
    ids = list(stale.values_list("pk", flat=True))
    return _fail_active(ids, error_of=lambda r: f"heartbeat lost: no heartbeat for more than {timeout} s")


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
