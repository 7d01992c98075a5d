"""Reads behind the progress and ETA fields: each run's progress and finish ETA (with the pace factors of the
latest finished runs of its kind), the predicted finishes of the runs holding slots, and a typical run's
duration; the queue ETA (runs/scheduling/queue.py) is built from the last two. The arithmetic is
runs/scheduling/progress.py and runs/scheduling/pace.py."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from runs.models import ACTIVE_STATUSES, Run, RunStatus
from runs.scheduling.pace import pace_factors
from runs.scheduling.progress import Progress, median, run_progress
from runs.slots.grant import latest_end
from trainer.config import TrainConfig

# ETA of a run's finish is shown while it trains (a stopping run finishes as soon as its job stops).
ETA_STATUSES = (RunStatus.RUNNING,)
# A typical run's duration (slot held: grant to finish): the median over the latest succeeded runs.
TYPICAL_SAMPLE = 20
TYPICAL_WINDOW = timedelta(days=7)
# The finished runs whose pace profiles correct a running run's ETA: the latest ones of its kind.
PACE_SAMPLE = 20
# A submitted config holds only the keys its submitter set; the rest are the trainer's defaults.
DEFAULTS = {"steps": TrainConfig.steps, "eval_every": TrainConfig.eval_every}


def progress_of(run: Run, *, now: datetime | None = None, paces: dict[str, dict[int, float]] | None = None) -> Progress:
    """`progress` (0..1, from the first train event on) and, while the run is running, `eta_finish_seconds`.
    `paces`: pace factors by kind, read once for several runs (filled in as kinds are met)."""
    now = now or timezone.now()
    end = latest_end(run.granted_at, run.time_limit_seconds)
    running = run.status in ETA_STATUSES
    pace = None
    if running:
        paces = {} if paces is None else paces
        if run.kind not in paces:
            paces[run.kind] = pace_of(kind=run.kind, now=now)
        pace = paces[run.kind]
    estimate = run_progress(
        summary=run.summary if isinstance(run.summary, dict) else {},
        config=run.config if isinstance(run.config, dict) else {},
        defaults=DEFAULTS,
        now=now.timestamp(),
        deadline=end.timestamp() if end is not None else None,
        pace=pace,
    )
    return estimate if running else Progress(estimate.progress, None)


def pace_of(*, kind: str, now: datetime) -> dict[int, float]:
    """The pace factors per tenth of the latest runs of `kind` that succeeded lately (runs/scheduling/pace.py): one
    query, reading only their profiles."""
    profiles = (
        Run.objects.filter(kind=kind, status=RunStatus.SUCCEEDED, finished_at__gte=now - TYPICAL_WINDOW)
        .order_by("-finished_at")
        .values_list("summary__progress__marks", flat=True)[:PACE_SAMPLE]
    )
    return pace_factors(list(profiles))


def active_finishes(*, now: datetime) -> dict[int, float]:
    """Predicted finish time (seconds since the epoch) of each run holding a slot whose finish can be told: a
    running run's finish ETA; before it has one (starting, or before its second train step), its grant plus a
    typical run of its kind, but not before now. Never after the end of its time limit. With neither, the run
    has no entry: its time limit is a bound, not an estimate (a default run's is a day away, which a fresh
    install's board showed as "~23h 59m"), and the queue behind it is told "unknown". At most max_total rows
    are read."""
    out: dict[int, float] = {}
    runs = Run.objects.filter(status__in=ACTIVE_STATUSES).only(
        "status", "kind", "summary", "config", "granted_at", "time_limit_seconds"
    )
    paces: dict[str, dict[int, float]] = {}
    typical: dict[str, float | None] = {}
    for run in runs:
        eta = progress_of(run, now=now, paces=paces).eta_finish_seconds
        if eta is not None:
            out[run.pk] = now.timestamp() + eta
            continue
        ends = [end.timestamp()] if (end := latest_end(run.granted_at, run.time_limit_seconds)) else []
        if run.kind not in typical:
            typical[run.kind] = typical_run_seconds(now=now, kind=run.kind)
        expected = typical[run.kind]
        if expected is not None and run.granted_at is not None:
            out[run.pk] = min([max(now.timestamp(), run.granted_at.timestamp() + expected), *ends])
    return out


def typical_run_seconds(*, now: datetime, kind: str | None = None) -> float | None:
    """Median grant-to-finish seconds of the latest succeeded runs (of `kind`, when given; None when none finished
    lately)."""
    rows = Run.objects.filter(
        status=RunStatus.SUCCEEDED, finished_at__gte=now - TYPICAL_WINDOW, granted_at__isnull=False
    )
    if kind is not None:
        rows = rows.filter(kind=kind)
    recent = rows.order_by("-finished_at").values_list("granted_at", "finished_at")[:TYPICAL_SAMPLE]
    return median([(f - g).total_seconds() for g, f in recent if f is not None and g is not None and f > g])
