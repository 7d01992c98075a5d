"""The Ray job API as the launcher uses it: the client, a run attempt's submission id, the ingest token and
serving key hand-over files, submitting a job (idempotent per attempt) and stopping one.

A launch is idempotent: the Ray `submission_id` is derived from the run id and attempt, so a second launch of
the same attempt (a redelivered Celery task, the tick's lost-launch sweep) finds the job and only records it.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import requests
from django.conf import settings

from runs.execution.jobs import JobSpec, run_artifacts_dir
from runs.models import Run
from trainer.serving_key import SERVING_KEY_FILE_ENV

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

logger = logging.getLogger(__name__)


class RayUnavailable(Exception):
    """The Ray job API could not be reached; the launch is retried by the tick (the run stays `starting`)."""


AGENT_WAIT_SECONDS = 30

# What the job client raises when the job API cannot be reached (its constructor raises the builtin one).
RAY_UNREACHABLE = (ConnectionError, requests.RequestException)


@lru_cache(maxsize=4)
def _client(address: str) -> JobSubmissionClient:
    # Ray is loaded by the processes that launch (Celery workers) when they first do, never by the web process.
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address)


def ray_client() -> JobSubmissionClient:
    try:
        return _client(settings.RAY_ADDRESS)
    except (*RAY_UNREACHABLE, RuntimeError) as exc:  # the constructor probes the job API
        raise RayUnavailable(f"Ray job API at {settings.RAY_ADDRESS} is not reachable: {exc}") from exc


def submission_id_for(run: Run) -> str:
    """Stable per (run, attempt); the prefix keeps installations sharing one Ray cluster apart."""
    return f"{settings.RAY_SUBMISSION_PREFIX}-{run.pk}-{run.attempt}"


def ingest_token_file_write(run: Run) -> Path:
    """Write the current attempt's ingest token to RUN_ARTIFACTS_DIR/<id>/ingest-token, mode 0600, atomically.
    The job reads it from there ($RUN_INGEST_TOKEN_FILE): the Ray job API shows every job's runtime env,
    entrypoint and metadata to anyone who can list jobs, so the token goes in none of them. Rewriting it on a
    relaunch of the same attempt writes the same token."""
    return _secret_file_write(run, "ingest-token", run.ingest_token)


def serving_key_file_write(run: Run) -> Path:
    """Write the current attempt's serving key (what the proxy shows the run's session server) to
    RUN_ARTIFACTS_DIR/<id>/serving-key, the same way as the ingest token; the job reads it from
    $RLCP_SERVING_KEY_FILE (trainer/serving_key.py)."""
    return _secret_file_write(run, "serving-key", run.serving_keys()[0])


def _secret_file_write(run: Run, name: str, value: str) -> Path:
    directory = run_artifacts_dir(run.pk)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    tmp = directory / f".{name}.{os.getpid()}"
    tmp.unlink(missing_ok=True)  # a leftover would keep its own mode
    fd = os.open(tmp, os.O_WRONLY | os.O_EXCL | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    os.replace(tmp, path)
    return path


def job_submit(run: Run, spec: JobSpec) -> str:
    """Submit the run's job unless a job with its submission id exists; returns the submission id."""
    client = ray_client()
    submission_id = submission_id_for(run)
    env = {
        "RUN_ID": str(run.pk),
        "RUN_INGEST_TOKEN_FILE": str(ingest_token_file_write(run)),
        SERVING_KEY_FILE_ENV: str(serving_key_file_write(run)),
        "RUN_ATTEMPT": str(run.attempt),
        # Cancel: Ray signals the entrypoint, waits this long for it to checkpoint and exit, then SIGKILLs it.
        "RAY_JOB_STOP_WAIT_TIME_S": str(settings.RUN_STOP_GRACE_SECONDS),
        # SIGINT, not Ray's default SIGTERM: ray.init in the job's driver replaces a Python SIGTERM handler with
        # Ray's own (print the stack, exit), so the trainer would never checkpoint; it handles SIGINT alike.
        "RAY_JOB_STOP_SIGNAL": "SIGINT",
        **spec.env,
    }
    # No OMP_NUM_THREADS etc. above: the trainer sets its own threads (driver and each actor, from its bundle).
    # The entrypoint reserves the driver bundle (0 / absent: nothing); the actors are in the job's placement group.
    cpus, gpus, memory = (
        spec.entrypoint_num_cpus or None,
        spec.entrypoint_num_gpus or None,
        spec.entrypoint_memory or None,
    )
    deadline = time.monotonic() + AGENT_WAIT_SECONDS
    while True:
        try:
            client.submit_job(
                entrypoint=shlex.join(spec.entrypoint),
                submission_id=submission_id,
                runtime_env={"env_vars": env},
                metadata={"platform_run": str(run.pk), "attempt": str(run.attempt), "kind": run.kind},
                entrypoint_num_cpus=cpus,
                entrypoint_num_gpus=gpus,
                entrypoint_memory=memory,
            )
            logger.info(
                "run %s: submitted Ray job %s (entrypoint CPU %s, GPU %s, memory %s)",
                run.pk,
                submission_id,
                cpus or 0,
                gpus or 0,
                memory or 0,
            )
            return submission_id
        except RuntimeError as exc:
            if "already exists" in str(exc):
                logger.info("run %s: Ray job %s already exists; recording it", run.pk, submission_id)
                return submission_id
            if "No available agent" not in str(exc):
                raise
            # A head that just started answers before its job agent registered (a minute and more on a
            # loaded machine): wait a little, then leave the run `starting` for the tick to launch again.
            if time.monotonic() > deadline:
                raise RayUnavailable(f"Ray at {settings.RAY_ADDRESS} has no job agent yet: {exc}") from exc
            time.sleep(1)
        except RAY_UNREACHABLE as exc:
            raise RayUnavailable(f"Ray job API at {settings.RAY_ADDRESS} is not reachable: {exc}") from exc
