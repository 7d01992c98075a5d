"""The tick's view of Ray: bring every active run in line with the state of its Ray job.

Job ended -> the run is finished with the job's outcome (runs/execution/outcome.py; follow-ups come from
run_finish); job vanished -> failed with the reason; a `starting` run without a placement group whose job
already runs and posts is re-attached as `running`, never relaunched; a `stopping` run's job is asked to stop
again until it does. Runs granted but never launched are relaunched by the liveness sweep
(runs/execution/liveness.py), which also reads the statuses observed here.
A job's own final event usually finished the run already; then the run is no longer active and not looked at.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from runs.core.lifecycle import run_transition
from runs.errors import InvalidTransition
from runs.execution.launch import job_stop
from runs.execution.liveness import has_placement_group
from runs.execution.outcome import error_tail, run_job_finished
from runs.execution.ray import RAY_UNREACHABLE, RayUnavailable, ray_client, submission_id_for
from runs.models import ACTIVE_STATUSES, Run, RunStatus
from runs.scheduling.enqueue import run_requeue

if TYPE_CHECKING:
    from ray.job_submission import JobDetails

logger = logging.getLogger(__name__)

# Ray's JobStatus values (a str enum, compared by value so this module does not load Ray).
JOB_SUCCEEDED, JOB_STOPPED, JOB_FAILED, JOB_RUNNING = "SUCCEEDED", "STOPPED", "FAILED", "RUNNING"


def job_outcome(run: Run, info: JobDetails) -> tuple[str, str] | None:
    """The (status, error) a run gets for a job in a terminal state; None while the job is still going."""
    sid = run.ray_submission_id
    stopping = run.status == RunStatus.STOPPING
    if info.status == JOB_SUCCEEDED:
        return RunStatus.SUCCEEDED, ""
    if info.status == JOB_STOPPED:
        if stopping:
            return RunStatus.CANCELLED, run.error
        return RunStatus.FAILED, f"Ray job {sid} was stopped outside the platform"
    if info.status == JOB_FAILED:
        if stopping:
            return RunStatus.CANCELLED, f"{run.error}; the job exited while stopping: {error_tail(info.message)}"
        return RunStatus.FAILED, f"Ray job {sid} failed: {error_tail(info.message or 'no message from Ray')}"
    return None


def _reattach(run: Run) -> str:
    """A `starting` run whose job Ray reports RUNNING and that has posted (a worker died between the job's
    report and the move, or the move was lost): record it as running, never launch it again. A run with a
    placement group becomes `running` only from its job's `ready` event (before it, the job runs but waits)."""
    if run.heartbeat_at is None or has_placement_group(run):
        return "unchanged"
    try:
        run_transition(run=run, status=RunStatus.RUNNING)
        logger.info("run %s: re-attached to running Ray job %s", run.pk, run.ray_submission_id)
    except InvalidTransition:
        return "unchanged"  # the ingest got there first, or the run was cancelled meanwhile
    return "reattached"


def _job_missing(run: Run) -> str:
    if run.status == RunStatus.STARTING:
        return "not submitted yet"  # recorded but never submitted: the liveness sweep launches it again
    if run.status == RunStatus.STOPPING:
        run_job_finished(run=run, status=RunStatus.CANCELLED, error=run.error)
        return "cancelled"
    run_job_finished(
        run=run,
        status=RunStatus.FAILED,
        error=(f"Ray job {run.ray_submission_id} vanished: the Ray cluster no longer knows it (was it restarted?)"),
    )
    return "vanished"


def run_reconcile(*, run: Run, info: JobDetails | None) -> str:
    """Apply one job observation (None: Ray does not know the job) to the run; returns what was done."""
    if info is None:
        return _job_missing(run)
    if run.status == RunStatus.STARTING and info.status == JOB_SUCCEEDED and has_placement_group(run):
        # The job exits 0 right after its placement `timeout` event; that event was lost: same outcome.
        old = run_requeue(run=run, reason="the job ended before its placement group was ready")
        return "requeued" if old is not None else "unchanged"
    outcome = job_outcome(run, info)
    if outcome is not None:
        run_job_finished(run=run, status=outcome[0], error=outcome[1])
        return outcome[0]
    if run.status == RunStatus.STARTING and info.status == JOB_RUNNING:
        return _reattach(run)
    if run.status == RunStatus.STOPPING:
        job_stop(run)
        return "stop requested"
    return "unchanged"


def active_runs_with_jobs() -> list[Run]:
    """Active runs whose current attempt has a recorded Ray job."""
    return [
        run
        for run in Run.objects.filter(status__in=ACTIVE_STATUSES).exclude(ray_submission_id="")
        # A resumed run still shows its previous attempt's job until the launch records the new one.
        if run.ray_submission_id == submission_id_for(run)
    ]


def jobs_observe(runs: list[Run]) -> dict[int, JobDetails | None] | None:
    """Ray's view of each run's current job ({run id: details, None when Ray does not know the job}); None
    when Ray's job API is not reachable (then nothing may be concluded from a job's absence)."""
    if not runs:
        return {}
    try:
        client = ray_client()
    except RayUnavailable:
        logger.warning("Ray job API not reachable")
        return None
    seen: dict[int, JobDetails | None] = {}
    for run in runs:
        try:
            seen[run.pk] = client.get_job_info(run.ray_submission_id)
        except RuntimeError as exc:
            if "does not exist" not in str(exc):
                logger.warning("run %s: reading Ray job %s failed: %s", run.pk, run.ray_submission_id, exc)
                continue  # not observed: neither alive nor gone
            seen[run.pk] = None
        except RAY_UNREACHABLE:
            logger.warning("Ray job API stopped answering")
            return None
    return seen


def job_statuses(observed: dict[int, JobDetails | None]) -> dict[int, str | None]:
    """{run id: Ray's JobStatus value, None for a job Ray does not know} (what the liveness sweeps read)."""
    return {pk: (str(getattr(info.status, "value", info.status)) if info else None) for pk, info in observed.items()}


def runs_reconcile(observed: dict[int, JobDetails | None] | None = None) -> dict[int, str]:
    """Bring every observed run in line with its job (observes them now when `observed` is not given);
    returns {run id: what was done}. Ray unreachable: nothing is done."""
    runs = active_runs_with_jobs()
    if observed is None:
        observed = jobs_observe(runs)
        if observed is None:
            return {}
    done: dict[int, str] = {}
    for run in runs:
        if run.pk not in observed:
            continue
        try:
            done[run.pk] = run_reconcile(run=run, info=observed[run.pk])
        except Exception:  # noqa: BLE001 - one bad run must not stop the sweep of the others
            logger.exception("run %s: reconcile failed", run.pk)
    return done
