"""Celery tasks, the entry points of the control plane's background work: the periodic tick (the outbox's
leftovers, cluster read, reconcile, liveness and node loss, time limits, schedules, grant fallback, lost
launches), the launcher's (launch a granted run, stop a run's job) and the follow-ups of a finished run. Tasks
take ids and never wait for slots or training. The outbox's effects name them (runs/outbox/effects.py: the
drainer sends the launcher's to a worker and runs the follow-ups in its own process) rather than importing
this module, which sits above runs.core.lifecycle."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

from celery import shared_task
from celery.signals import task_failure
from django.utils import timezone

from runs.core import lifecycle
from runs.execution import capacity, followups, launch, liveness, preempt, reconcile, sweeps
from runs.execution.schedules import schedules_submit_due
from runs.metrics import spec as metric
from runs.metrics.hooks import task_failure_record
from runs.metrics.record import timed
from runs.outbox import effects
from runs.outbox.drain import effects_drain

logger = logging.getLogger(__name__)
# Every task failure of this worker process is counted (rlcp_celery_task_failures_total).
task_failure.connect(task_failure_record, weak=False)

# Reconcile outcomes that change nothing (a job still running, a launch not yet submitted): not logged.
QUIET_OUTCOMES = frozenset({"unchanged", "not submitted yet"})


@shared_task(name="runs.tasks.tick")
def tick() -> dict[str, Any]:
    started = time.monotonic()
    try:
        return _tick()
    finally:
        timed(metric.TICK_DURATION, started)


def _tick() -> dict[str, Any]:
    # First what a crash or an error left in the outbox (committed moves whose launch, stop or follow-ups were
    # not done after their commit), whether Ray answers or not: sending a task and the follow-ups need no Ray.
    drained = effects_drain()
    now = timezone.now()
    # The cluster first: node rows for admission and node loss, and whether Ray answers at all. Ray not
    # reachable: nothing is failed for liveness (no reclaim, launch timeout, node loss); time limits still apply.
    reachable = capacity.cluster_refresh(now=now)
    observed = reconcile.jobs_observe(reconcile.active_runs_with_jobs()) if reachable else None
    # Job outcomes first: a run whose job ended gets its real result, not "heartbeat lost".
    reconciled = reconcile.runs_reconcile(observed) if observed is not None else {}
    jobs = reconcile.job_statuses(observed) if observed is not None else None
    now = timezone.now()
    done: dict[str, Any] = {
        "effects": drained,
        "reconciled": reconciled,
        "unreachable": [] if jobs is not None else ["ray"],
    }
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
    # Preemption (off unless staff turned it on): victims past their grace period back in the queue, then new
    # victims chosen for waiting runs the grant pass could not place (runs/execution/preempt.py).
    done["preempted_hard"] = preempt.preemptions_overdue(now=timezone.now())
    done["preempt_requested"] = preempt.preemptions_request(now=timezone.now())
    # A tick that changed nothing says nothing (one runs every 2 s); an unreachable Ray is logged by the read.
    changed = {
        **done,
        "unreachable": [],
        "reconciled": {pk: what for pk, what in reconciled.items() if what not in QUIET_OUTCOMES},
    }
    if any(changed.values()):
        logger.info("tick: %s", ", ".join(f"{what} {ids}" for what, ids in changed.items() if ids))
    return done


@shared_task(name=effects.TASK_DISPATCH)
def dispatch_run(run_id: int) -> str:
    """Launch a granted (`starting`) run; anything else is a stale message and ignored."""
    return launch.launch_run(run_id)


@shared_task(name=effects.TASK_STOP)
def stop_run(run_id: int, job: str = "") -> str:
    """Stop the run's job `job` (its submission id at the move; "" for a message sent before it was carried: the
    run's current job); a `stopping` run without a job is cancelled at once."""
    return launch.stop_run(run_id, job)


@shared_task(name=effects.TASK_FOLLOWUPS)
def run_followups(run_id: int, finished_at: str) -> str:
    """Evaluation after a success, auto-resume after a failure, for the finish at `finished_at` (ISO 8601). Run
    by the outbox's drainer in its own process, in the transaction that marks the effect done; the drainer
    retries it (a refusal, ServiceError, is its outcome: the run moved on)."""
    return followups.run_followups(run_id=run_id, finished_at=datetime.fromisoformat(finished_at))
