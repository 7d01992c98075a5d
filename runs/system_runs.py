"""Runs the platform starts by itself, and the run kinds that execute on Ray.

Registers the `eval` kind (held-out metrics of a finished training run's final checkpoint), attaches the Ray
launch/stop hooks to `rl_train` and `eval`, and reacts to finished runs: a succeeded `rl_train` run gets an
`eval` run (origin `system`, same owner, parent = the run); a failed run with `auto_resume` is resumed.
"""
from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction

from runs import kinds
from runs.errors import InvalidInput, ServiceError
from runs.events import PLATFORM_SOURCE
from runs.models import Origin, Run, RunEvent, RunStatus

logger = logging.getLogger(__name__)

EVAL_KIND = "eval"
EVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["source_run"],
    "properties": {
        "source_run": {"type": "integer", "minimum": 1,
                       "description": "Id of the rl_train run whose last checkpoint is evaluated."},
    },
}


def eval_config_validate(config: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(config) - set(EVAL_SCHEMA["properties"]))
    if unknown:
        raise InvalidInput(f"unknown key(s) {unknown}; allowed: ['source_run']", field=f"config.{unknown[0]}")
    source = config.get("source_run")
    if not isinstance(source, int) or isinstance(source, bool) or source < 1:
        raise InvalidInput("must be the id (a positive integer) of an rl_train run", field="config.source_run")
    return {"source_run": source}  # that it exists and may be seen: eval_authorize, which knows the owner


def eval_authorize(config: dict[str, Any], owner: Any) -> None:
    """The source run must be an rl_train run the owner may see (own runs; staff: all). One query either way,
    so another user's run is answered exactly like a missing one (same 400, same message, same work)."""
    from runs.selectors import run_list

    source = config["source_run"]
    if not run_list(user=owner).filter(pk=source, kind=kinds.DEFAULT_KIND).exists():
        raise InvalidInput(f"no {kinds.DEFAULT_KIND} run with id {source}", field="config.source_run")


def eval_launch(run: Run) -> None:
    from runs.launch import JobSpec, run_checkpoint_dir, run_events_url, run_launch_job

    checkpoint = run_checkpoint_dir(run.config["source_run"])
    spec = JobSpec(entrypoint=["python", "-m", "trainer", "eval", "--checkpoint", str(checkpoint),
                               "--events", run_events_url(run)], wants_gpu=True)
    run_launch_job(run, spec)


def rl_train_launch(run: Run) -> None:
    from runs.launch import run_launch

    run_launch(run)


def ray_job_stop(run: Run) -> None:
    from runs.launch import job_stop

    job_stop(run)


def execution_register() -> None:
    """Register the eval kind and attach the Ray hooks (called once per process from RunsConfig.ready)."""
    kinds.kind_register(kinds.RunKind(
        name=EVAL_KIND, validate_config=eval_config_validate, json_schema=lambda: EVAL_SCHEMA,
        description="Held-out evaluation of an rl_train run's last checkpoint (python -m trainer eval)",
        launch=eval_launch, stop=ray_job_stop, authorize=eval_authorize,
    ))
    kinds.kind_attach(kinds.DEFAULT_KIND, launch=rl_train_launch, stop=ray_job_stop)


def eval_run_submit(*, run: Run) -> Run | None:
    """Submit the evaluation of a succeeded training run once (racing finalizers: the grant lock decides).
    Not refused by the owner's per-user caps: it replaces the training run that just finished, one for one."""
    from runs import services
    from runs.slots import store

    with transaction.atomic():
        store.slots_lock()
        if Run.objects.filter(parent=run, origin=Origin.SYSTEM, kind=EVAL_KIND).exists():
            return None
        return services.run_submit(owner=run.owner, name=f"eval of {run.name}"[:200], origin=Origin.SYSTEM,
                                   kind=EVAL_KIND, config={"source_run": run.pk}, parent=run, user_caps=False)


def eval_summary_record(*, run: Run) -> None:
    """Put the metrics of the eval job's final status event under `summary["eval"]` (the live fold keeps only
    gate/version/sampler/train/checkpoint)."""
    final = (RunEvent.objects.filter(run=run, type="status").exclude(source=PLATFORM_SOURCE)
             .order_by("-seq").values_list("data", flat=True).first())
    if final and isinstance(final.get("metrics"), dict):
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.pk)
            locked.summary = {**(locked.summary or {}), "eval": final["metrics"]}
            locked.save(update_fields=["summary"])


def system_runs_after_finish(*, run: Run) -> None:
    """React to a run that just finished; errors are logged, never undo the finish."""
    try:
        if run.status == RunStatus.SUCCEEDED and run.kind == kinds.DEFAULT_KIND:
            child = eval_run_submit(run=run)
            if child is not None:
                logger.info("run %s succeeded: submitted eval run %s", run.pk, child.pk)
        elif run.status == RunStatus.FAILED and run.auto_resume and run.attempt < settings.RUN_AUTO_RESUME_MAX:
            from runs import services

            services.run_resume(run=run, by="the platform (auto-resume)", user_caps=False)
            logger.info("run %s failed: resumed automatically (attempt %s)", run.pk, run.attempt + 1)
    except ServiceError:
        logger.exception("run %s: system follow-up failed", run.pk)
