"""Reads behind the progress and ETA fields: each run's progress and finish ETA, the predicted finishes of the
runs holding slots, and a typical run's duration; the queue ETA (runs/queue.py) is built from the last two.
The arithmetic is runs/progress.py."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from runs.models import ACTIVE_STATUSES, Run, RunStatus
from runs.progress import Progress, median, run_progress
from runs.slots.grant import latest_end
from trainer.config import TrainConfig

# ETA of a run's finish is shown while it trains (a stopping run finishes as soon as its job stops).
ETA_STATUSES = (RunStatus.RUNNING,)
# A typical run's duration (slot held: grant to finish): the median over the latest succeeded runs.
TYPICAL_SAMPLE = 20
TYPICAL_WINDOW = timedelta(days=7)
# A submitted config holds only the keys its submitter set; the rest are the trainer's defaults.
DEFAULTS = {"steps": TrainConfig.steps, "eval_every": TrainConfig.eval_every}


def progress_of(run: Run, *, now: datetime | None = None) -> Progress:
    """`progress` (0..1, from the first train event on) and, while the run is running, `eta_finish_seconds`."""
    now = now or timezone.now()
    end = latest_end(run.granted_at, run.time_limit_seconds)
    estimate = run_progress(
        summary=run.summary if isinstance(run.summary, dict) else {},
        config=run.config if isinstance(run.config, dict) else {},
        defaults=DEFAULTS,
        now=now.timestamp(),
        deadline=end.timestamp() if end is not None else None,
    )
    if run.status not in ETA_STATUSES:
        return Progress(estimate.progress, None)
    return estimate


def active_finishes(*, now: datetime) -> dict[int, float]:
    """Predicted finish time (seconds since the epoch) of each run holding a slot whose finish can be told: a
    running run's finish ETA, else the end of its time limit. At most max_total rows are read."""
    out: dict[int, float] = {}
    runs = Run.objects.filter(status__in=ACTIVE_STATUSES).only(
        "status", "summary", "config", "granted_at", "time_limit_seconds"
    )
    for run in runs:
        eta = progress_of(run, now=now).eta_finish_seconds
        if eta is not None:
            out[run.pk] = now.timestamp() + eta
            continue
        end = latest_end(run.granted_at, run.time_limit_seconds)
        if end is not None:
            out[run.pk] = end.timestamp()
    return out


def typical_run_seconds(*, now: datetime) -> float | None:
    """Median grant-to-finish seconds of the latest succeeded runs (None when none finished lately)."""
    rows = (
        Run.objects.filter(status=RunStatus.SUCCEEDED, finished_at__gte=now - TYPICAL_WINDOW, granted_at__isnull=False)
        .order_by("-finished_at")
        .values_list("granted_at", "finished_at")[:TYPICAL_SAMPLE]
    )
    return median([(f - g).total_seconds() for g, f in rows if f is not None and g is not None and f > g])
