"""The one launcher: hands every granted run of every kind to Ray and stops its job. `launch_run` takes a
`starting` run, asks its kind for the job (`job_spec`, pure), writes the spec's files and submits; the run
stays `starting` until its job reports (runs/telemetry/ingest.py); any error on the way fails the run through
runs.core.lifecycle.run_finish (so auto-resume applies). `job_stop` asks the run's job to stop; the reconcile (or
the job's own final event) records it."""

from __future__ import annotations

import logging
from pathlib import Path

from runs.core.lifecycle import run_finish
from runs.execution import ray
from runs.execution.jobs import JobSpec, run_artifacts_dir
from runs.execution.kinds import kind_get
from runs.models import Run, RunStatus

logger = logging.getLogger(__name__)


def job_files_write(run: Run, spec: JobSpec) -> None:
    """Write the spec's files; each must be under the run's artifacts directory (ValueError otherwise)."""
    root = run_artifacts_dir(run.pk).resolve()
    for name, content in spec.files.items():
        path = Path(name).resolve()
        if root not in path.parents:
            raise ValueError(f"run {run.pk}: a job file must be under {root}, not {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def run_launch_job(run: Run, spec: JobSpec) -> None:
    """Record the submission id, write the spec's files, submit. The run stays `starting`: it becomes `running`
    when its job reports its placement group ready (or, for a kind without one, at the job's first post)."""
    submission_id = ray.submission_id_for(run)
    # Recorded first, so that a worker dying right after the submit leaves a run whose job can be found. Only for
    # the attempt this launch was read at: a run requeued and granted again since is the next attempt's launch
    # (its own task), and this one must neither name its job nor submit one.
    this_attempt = Run.objects.filter(pk=run.pk, status=RunStatus.STARTING, attempt=run.attempt)
    if not this_attempt.update(ray_submission_id=submission_id):
        return  # cancelled, finished or requeued since the grant: nothing to launch
    run.ray_submission_id = submission_id
    job_files_write(run, spec)
    try:
        ray.job_submit(run, spec)
    except ray.RayUnavailable:
        logger.warning("run %s: Ray is not reachable; the tick will launch it again", run.pk, exc_info=True)
        return
    current = Run.objects.get(pk=run.pk)
    if current.status not in (RunStatus.STARTING, RunStatus.RUNNING) or current.attempt != run.attempt:
        # Cancelled, failed or requeued while we submitted. A run that no longer wants this job must not keep
        # it: the cancel path may have looked for the job before it existed.
        job_submission_stop(submission_id)


def launch_run(run_id: int) -> str:
    """Launch a granted (`starting`) run; anything else is a stale message and ignored. A launch error ends the
    run with the reason (and never loops: the run is failed, not left `starting`)."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or run.status != RunStatus.STARTING:
        return "skipped"
    try:
        kind = kind_get(run.kind)
    except Exception as exc:  # noqa: BLE001 - a kind removed since submit: fail the run, free the slot
        run_finish(run=run, status=RunStatus.FAILED, error=str(exc))
        return "failed"
    if kind.job_spec is None:
        run_finish(run=run, status=RunStatus.FAILED, error=f"run kind {kind.name!r} has no launcher")
        return "failed"
    try:
        run_launch_job(run, kind.job_spec(run))
    except Exception as exc:  # noqa: BLE001
        logger.exception("launching run %s failed", run_id)
        run_finish(run=run, status=RunStatus.FAILED, error=f"launch failed: {exc}")
        return "failed"
    return "launched"


def job_stop(run: Run) -> None:
    """Ask the run's Ray job to stop (SIGINT, then SIGKILL after RUN_STOP_GRACE_SECONDS). The job's final event
    or the tick's reconcile records the outcome; a `stopping` run with no job at all is cancelled here at once."""
    if run.ray_submission_id != ray.submission_id_for(run):  # this attempt has no job (none yet, or an old one)
        if run.status == RunStatus.STOPPING:
            run_finish(run=run, status=RunStatus.CANCELLED, error=run.error)
        return
    try:
        ray.ray_client().stop_job(run.ray_submission_id)
    except RuntimeError as exc:
        if "does not exist" not in str(exc):
            raise
        fresh = Run.objects.get(pk=run.pk)
        if fresh.status == RunStatus.STOPPING:
            run_finish(run=fresh, status=RunStatus.CANCELLED, error=fresh.error)
    except (*ray.RAY_UNREACHABLE, ray.RayUnavailable):
        logger.warning("run %s: Ray not reachable to stop %s; the tick retries", run.pk, run.ray_submission_id)


def job_submission_stop(submission_id: str) -> None:
    """Ask one Ray job to stop by its submission id (an old attempt's job, which job_stop no longer names);
    a job Ray does not know, or Ray unreachable, is left alone (an unknown job runs nothing). Best effort: it
    never raises (the state change it follows is committed)."""
    if not submission_id:
        return
    try:
        ray.ray_client().stop_job(submission_id)
    except RuntimeError as exc:
        if "does not exist" not in str(exc):
            logger.warning("stopping Ray job %s failed: %s", submission_id, exc)
    except Exception as exc:  # noqa: BLE001 - unreachable, refused (auth), anything: logged, not raised
        logger.warning("Ray not reachable to stop job %s: %s", submission_id, exc)


def stop_run(run_id: int, job: str = "") -> str:
    """Stop a run's job (the run is `stopping`, or was ended by the platform while its job may still run).
    `job` is the submission id the run had at the move; when the run has moved on to another attempt since (an
    automatic resume), that old job is stopped by its id and the new attempt is left alone."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return "skipped"
    if job and job != run.ray_submission_id:
        job_submission_stop(job)
        return "old job stop requested"
    job_stop(run)
    return "stop requested"
