"""The tick's view of Ray: bring every active run in line with the state of its Ray job.

Job ended -> the run is finished with the job's outcome (runs/execution/outcome.py; follow-ups come from
run_finish); job vanished -> failed with the reason; a `starting` run whose job already runs (its worker died
after submitting) is re-attached as `running`, never relaunched; a `stopping` run's job is asked to stop again
until it does. Runs granted but never launched are relaunched by the tick's lost-launch sweep (runs/tasks.py).
A job's own final event usually finished the run already; then the run is no longer active and not looked at.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from runs.errors import InvalidTransition
from runs.execution.launch import job_stop
from runs.execution.outcome import error_tail, run_job_finished
from runs.execution.ray import RAY_UNREACHABLE, RayUnavailable, ray_client, submission_id_for
from runs.lifecycle import run_transition
from runs.models import ACTIVE_STATUSES, Run, RunStatus

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


def _reattach(run: Run) -> None:
    """A `starting` run whose job is already running: its launch happened; record it, do not launch again."""
    try:
        run_transition(run=run, status=RunStatus.RUNNING)
        logger.info("run %s: re-attached to running Ray job %s", run.pk, run.ray_submission_id)
    except InvalidTransition:
        pass  # the launching worker got there first, or the run was cancelled meanwhile


def _job_missing(run: Run) -> str:
    if run.status == RunStatus.STARTING:
        return "not submitted yet"  # recorded but never submitted: the lost-launch sweep launches it
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
    outcome = job_outcome(run, info)
    if outcome is not None:
        run_job_finished(run=run, status=outcome[0], error=outcome[1])
        return outcome[0]
    if run.status == RunStatus.STARTING and info.status == JOB_RUNNING:
        _reattach(run)
        return "reattached"
    if run.status == RunStatus.STOPPING:
        job_stop(run)
        return "stop requested"
    return "unchanged"


def runs_reconcile() -> dict[int, str]:
    """Observe the Ray job of every active run that has one; returns {run id: what was done}."""
    runs = [
        run
        for run in Run.objects.filter(status__in=ACTIVE_STATUSES).exclude(ray_submission_id="")
        # A resumed run still shows its previous attempt's job until the launch records the new one.
        if run.ray_submission_id == submission_id_for(run)
    ]
    if not runs:
        return {}
    try:
        client = ray_client()
    except RayUnavailable:
        logger.warning("reconcile skipped: Ray job API not reachable")
        return {}
    done: dict[int, str] = {}
    for run in runs:
        try:
            info: JobDetails | None = client.get_job_info(run.ray_submission_id)
        except RuntimeError as exc:
            if "does not exist" not in str(exc):
                logger.warning("run %s: reading Ray job %s failed: %s", run.pk, run.ray_submission_id, exc)
                continue
            info = None
        except RAY_UNREACHABLE:
            logger.warning("reconcile stopped: Ray job API not reachable")
            break
        try:
            done[run.pk] = run_reconcile(run=run, info=info)
        except Exception:  # noqa: BLE001 - one bad run must not stop the sweep of the others
            logger.exception("run %s: reconcile failed", run.pk)
    return done
