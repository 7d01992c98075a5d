"""How a job's outcome finishes its run, whoever observed it: the job's own final report of its state (its
`status` event, stored as `job_status`: runs/telemetry/ingest.py, at once) or the tick's look at the Ray job
(runs/execution/reconcile.py). Both go through `run_job_finished`, which records an eval job's metrics before
runs.core.lifecycle.run_finish."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from runs.core.events import JOB_STATUS
from runs.core.lifecycle import run_finish
from runs.execution.kinds import EVAL_KIND
from runs.execution.preempt import preempt_requeue
from runs.models import Run, RunEvent, RunStatus

# Ray's job message holds the tail of the job's log on failure; keep the run's error readable.
ERROR_TAIL_CHARS = 4000


def error_tail(text: str | None) -> str:
    text = (text or "").strip()
    return text if len(text) <= ERROR_TAIL_CHARS else "..." + text[-ERROR_TAIL_CHARS:]


def event_outcome(run: Run, data: dict[str, Any]) -> tuple[str, str] | None:
    """The (status, error) a run gets from its job's final `job_status` event: `succeeded` or `failed`. None
    for any other report, and while the run is `stopping`: a cancel ends when the job has ended (the reconcile
    sees Ray's STOPPED), so a resume never races the old attempt's job for its checkpoint directory."""
    status = data.get("status")
    if run.status not in (RunStatus.STARTING, RunStatus.RUNNING):
        return None
    if status == RunStatus.SUCCEEDED:
        return RunStatus.SUCCEEDED, ""
    if status == RunStatus.FAILED:
        return RunStatus.FAILED, f"job failed: {error_tail(str(data.get('error') or '')) or 'no error given'}"
    return None


def eval_summary_record(*, run: Run) -> None:
    """Put the metrics of the eval job's final report of its state (`job_status`) under `summary["eval"]` (the
    live fold keeps only gate/version/sampler/train/checkpoint)."""
    final = RunEvent.objects.filter(run=run, type=JOB_STATUS).order_by("-seq").values_list("data", flat=True).first()
    if final and isinstance(final.get("metrics"), dict):
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.pk)
            locked.summary = {**(locked.summary or {}), "eval": final["metrics"]}
            locked.save(update_fields=["summary"])


def run_job_finished(*, run: Run, status: str, error: str) -> Run:
    """Finish a run from its job's outcome (follow-ups such as evaluation and auto-resume are scheduled by
    run_finish). An eval's metrics are stored first, so whoever sees `succeeded` sees the metrics too. A run being
    preempted whose job stopped (or failed) is not finished: it goes back to the queue (runs/execution/preempt.py)."""
    if status != RunStatus.SUCCEEDED and preempt_requeue(run=run):
        return Run.objects.get(pk=run.pk)
    if status == RunStatus.SUCCEEDED and run.kind == EVAL_KIND:
        eval_summary_record(run=run)
    return run_finish(run=run, status=status, error=error)
