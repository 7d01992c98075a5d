"""Celery tasks, the entry points of the control plane's background work: the periodic tick (cluster read,
reconcile, liveness and node loss, time limits, schedules, grant fallback, lost launches), the launcher's
hand-offs (launch a granted run, stop a run's job) and the follow-ups of a finished run. Tasks take ids and
never wait for slots or training. runs.lifecycle names them (TASK_*) rather than importing this module, which
sits above it."""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import Task, shared_task
from celery.signals import task_failure
from django.db import DatabaseError
from django.utils import timezone

from runs import handoff, lifecycle, sweeps
from runs.errors import ServiceError
from runs.execution import capacity, followups, launch, liveness, reconcile
from runs.metrics import spec as metric
from runs.metrics.hooks import task_failure_record
from runs.metrics.record import timed
from runs.schedules import schedules_submit_due

logger = logging.getLogger(__name__)
# Every task failure of this worker process is counted (rlcp_celery_task_failures_total).
task_failure.connect(task_failure_record, weak=False)

# Reconcile outcomes that change nothing (a job still running, a launch not yet submitted): not logged.
QUIET_OUTCOMES = frozenset({"unchanged", "not submitted yet"})
FOLLOWUPS_RETRY_SECONDS = 5
FOLLOWUPS_MAX_RETRIES = 20


@shared_task(name="runs.tasks.tick")
def tick() -> dict[str, Any]:
    started = time.monotonic()
    try:
        return _tick()
    finally:
        timed(metric.TICK_DURATION, started)


def _tick() -> dict[str, Any]:
    now = timezone.now()
    # The cluster first: node rows for admission and node loss, and whether Ray answers at all. Ray not
    # reachable: nothing is failed for liveness (no reclaim, launch timeout, node loss); time limits still apply.
    reachable = capacity.cluster_refresh(now=now)
    observed = reconcile.jobs_observe(reconcile.active_runs_with_jobs()) if reachable else None
    # Job outcomes first: a run whose job ended gets its real result, not "heartbeat lost".
    reconciled = reconcile.runs_reconcile(observed) if observed is not None else {}
    jobs = reconcile.job_statuses(observed) if observed is not None else None
    now = timezone.now()
    done: dict[str, Any] = {"reconciled": reconciled, "unreachable": [] if jobs is not None else ["ray"]}
    if jobs is not None:
        done["node_loss"] = liveness.runs_node_loss()
        starting = liveness.runs_starting_check(now=now, jobs=jobs)
        done["launch_timeout"], done["requeued"] = starting["launch_timeout"], starting["requeued"]
        done["reclaimed"] = sweeps.runs_reclaim_stale(now=now, jobs=jobs)
        for run_id in starting["relaunch"]:
            dispatch_run.delay(run_id)
        done["relaunched"] = starting["relaunch"]
    done["timed_out"] = sweeps.runs_enforce_time_limits(now=now)
    done["scheduled"] = schedules_submit_due(now=now)
    done["granted"] = lifecycle.slots_grant(reason="tick")
    # A tick that changed nothing says nothing (one runs every 2 s); an unreachable Ray is logged by the read.
    changed = {
        **done,
        "unreachable": [],
        "reconciled": {pk: what for pk, what in reconciled.items() if what not in QUIET_OUTCOMES},
    }
    if any(changed.values()):
        logger.info("tick: %s", ", ".join(f"{what} {ids}" for what, ids in changed.items() if ids))
    return done


@shared_task(name=handoff.TASK_DISPATCH)
def dispatch_run(run_id: int) -> str:
    """Launch a granted (`starting`) run; anything else is a stale message and ignored."""
    return launch.launch_run(run_id)


@shared_task(name=handoff.TASK_STOP)
def stop_run(run_id: int) -> str:
    """Stop a run's job; a `stopping` run without a job is cancelled at once."""
    return launch.stop_run(run_id)


@shared_task(name=handoff.TASK_FOLLOWUPS, bind=True, max_retries=FOLLOWUPS_MAX_RETRIES)
def run_followups(self: Task, run_id: int, attempt: int) -> str:
    """Evaluation after a success, auto-resume after a failure (idempotent). Run at once by the finishing
    process after commit; a failure there sends it here, to a worker, which retries database errors."""
    try:
        return followups.run_followups(run_id=run_id, attempt=attempt)
    except ServiceError as exc:  # e.g. the run changed meanwhile: nothing left to do, say why
        logger.warning("run %s: follow-up not applied: %s", run_id, exc)
        return "refused"
    except DatabaseError as exc:
        if self.request.is_eager:
            raise
        raise self.retry(exc=exc, countdown=FOLLOWUPS_RETRY_SECONDS) from exc
