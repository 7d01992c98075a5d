"""Celery tasks: the periodic tick (reclaim, time limits, grant fallback, lost launches) and the hand-off of
granted runs to their kind's launcher. Tasks take ids, call services, and never wait for slots or training."""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.utils import timezone

from runs import kinds, services
from runs.models import Run, RunStatus

logger = logging.getLogger(__name__)

# A granted run that has not heartbeated this long after its grant is launched again (its launch was lost);
# launchers are idempotent (Ray submission_id = run id), so a second launch of a live job is a no-op.
RELAUNCH_AFTER_SECONDS = 30
# Reconcile outcomes that change nothing (a job still running, a launch not yet submitted): not logged.
QUIET_OUTCOMES = frozenset({"unchanged", "not submitted yet"})


@shared_task(name="runs.tasks.tick")
def tick() -> dict[str, Any]:
    from runs.reconcile import runs_reconcile  # late: imports the Ray job client
    from runs.schedules import schedules_submit_due

    # Job outcomes first: a run whose job ended gets its real result, not "heartbeat lost".
    reconciled = runs_reconcile()
    now = timezone.now()
    reclaimed = services.runs_reclaim_stale(now=now)
    timed_out = services.runs_enforce_time_limits(now=now)
    scheduled = schedules_submit_due(now=now)
    granted = services.slots_grant(reason="tick")
    lost = list(
        Run.objects.filter(status=RunStatus.STARTING, heartbeat_at__isnull=True,
                           granted_at__lt=now - timedelta(seconds=RELAUNCH_AFTER_SECONDS))
        .values_list("pk", flat=True)
    )
    for run_id in lost:
        dispatch_run.delay(run_id)
    done = {"reconciled": reconciled, "reclaimed": reclaimed, "timed_out": timed_out, "scheduled": scheduled,
            "granted": granted, "relaunched": lost}
    # A tick that changed nothing says nothing (one runs every 2 s).
    changed = {**done, "reconciled": {pk: what for pk, what in reconciled.items() if what not in QUIET_OUTCOMES}}
    if any(changed.values()):
        logger.info("tick: %s", ", ".join(f"{what} {ids}" for what, ids in changed.items() if ids))
    return done


@shared_task(name="runs.tasks.dispatch_run")
def dispatch_run(run_id: int) -> str:
    """Hand a granted (`starting`) run to its kind's launcher; anything else is a stale message and ignored."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or run.status != RunStatus.STARTING:
        return "skipped"
    try:
        kind = kinds.kind_get(run.kind)
    except Exception as exc:  # noqa: BLE001 - a kind removed since submit: fail the run, free the slot
        services.run_finish(run=run, status=RunStatus.FAILED, error=str(exc))
        return "failed"
    if kind.launch is None:
        services.run_finish(run=run, status=RunStatus.FAILED, error=f"run kind {kind.name!r} has no launcher")
        return "failed"
    try:
        kind.launch(run)
    except Exception as exc:  # noqa: BLE001 - a launch error ends the run with the reason, never loops
        logger.exception("launching run %s failed", run_id)
        services.run_finish(run=run, status=RunStatus.FAILED, error=f"launch failed: {exc}")
        return "failed"
    return "launched"


@shared_task(name="runs.tasks.stop_run")
def stop_run(run_id: int) -> str:
    """Ask the kind to stop the run's job; with no stop hook there is no job to wait for, so a `stopping`
    run is finalized as cancelled at once."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return "skipped"
    kind = next((k for k in kinds.kinds_all() if k.name == run.kind), None)
    if kind is not None and kind.stop is not None:
        kind.stop(run)
        return "stop requested"
    if run.status == RunStatus.STOPPING:
        services.run_finish(run=run, status=RunStatus.CANCELLED, error=run.error)
        return "cancelled"
    return "nothing to stop"
