"""Progress and finish ETA of training runs, and the queue ETA built from them. Pure: no database, no clock.

A run's progress is its steps done over its steps total. Its finish ETA is the steps left times the recent time
per step, plus the evaluations left times the last evaluation's duration: the time per step is measured over
the last `WINDOW` train events that the ingest keeps in the summary (`progress_fold`), evaluations taken out,
and corrected by how finished runs' pace changed after the same point (runs/scheduling/pace.py), when enough of them
have. A queued run at overall position p starts when the p-th slot frees: the running runs free theirs at their
predicted finishes, and each run started on a freed slot frees it again after a typical run's duration
(`queue_starts`). docs/api.md describes the fields; tests/runs/test_progress.py replays recorded runs.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from runs.scheduling.pace import factor_at, marks_fold
from runs.summary_types import ProgressSummary

# Train events whose (ts, step) the summary keeps for the recent step rate.
WINDOW = 20
# Positions a queue ETA is computed for (beyond: null, "later than we can say").
QUEUE_HORIZON = 10_000


@dataclass(frozen=True)
class Progress:
    progress: float | None  # 0..1; None before the first train event
    eta_finish_seconds: float | None  # seconds until the run is predicted to finish; None when not known


def progress_fold(progress: Any, *, train: dict[str, Any], ts: float) -> ProgressSummary:
    """The summary's `progress` after a train event (`train`: its data) at `ts`: `points`, the newest WINDOW
    [ts, step, eval seconds] triples, `eval_s`, the latest evaluation's seconds, `clock`, the training seconds
    since the first train event (evaluations out), and `marks`, the run's pace profile (runs/scheduling/pace.py). A step
    at or below the last one (a resumed run restarts at its checkpoint) starts a new window, clock and profile."""
    progress = _dict(progress)
    kept = [p for p in (progress.get("points") or []) if _is_point(p)]
    step = _num(train.get("step"))
    eval_s = _span_seconds(train.get("eval_span"))
    last_eval = eval_s if eval_s else _num(progress.get("eval_s"))
    clock = _num(progress.get("clock")) or 0.0
    if step is None:  # not a step (the train schema requires one): the rest as it was
        return ProgressSummary(**{**progress, "points": kept, "eval_s": last_eval})
    restarted = bool(kept) and step <= kept[-1][1]
    if restarted:
        kept, clock = [], 0.0
    elif kept:
        clock += max(0.0, float(ts) - kept[-1][0] - eval_s)
    total = _num(train.get("steps_total"))
    marks = marks_fold(progress.get("marks"), step=step, total=total, clock=clock, restarted=restarted)
    kept.append([float(ts), step, eval_s])
    return ProgressSummary(points=kept[-WINDOW:], eval_s=last_eval, clock=round(clock, 4), marks=marks)


def step_seconds(points: list[list[float]]) -> float | None:
    """Seconds per training step over the window, evaluations taken out (None with fewer than two points)."""
    if len(points) < 2:
        return None
    (t0, s0), (t1, s1) = points[0][:2], points[-1][:2]
    evals = sum(p[2] for p in points[1:] if len(p) > 2)
    if t1 <= t0 or s1 <= s0:
        return None
    return max(0.0, t1 - t0 - evals) / (s1 - s0)


def evals_left(step: int, total: int, every: int) -> int:
    """Evaluations still to run after `step`: at each multiple of `every` and at the last step."""
    if every <= 0 or step >= total:
        return 0
    multiples = total // every - step // every
    return multiples + (0 if total % every == 0 else 1)


def run_progress(
    *,
    summary: dict[str, Any],
    config: dict[str, Any],
    defaults: dict[str, Any],
    now: float,
    deadline: float | None = None,
    pace: dict[int, float] | None = None,
) -> Progress:
    """Progress and finish ETA of a run from its summary (`train.step`, `train.steps_total`, `progress`) and
    config (`steps`, `eval_every`, `time_limit_s`; missing keys from `defaults`). `deadline` (seconds since the
    epoch): when the platform ends the run at the latest (its time limit), which caps the ETA. `pace`: the
    finished runs' pace factors per tenth (runs/scheduling/pace.py), which scale the recent time per step."""
    default_steps = int(defaults.get("steps", 0))
    train = _dict(summary.get("train"))
    step = _num(train.get("step"))
    if step is None:
        return Progress(None, None)
    total = _num(train.get("steps_total", config.get("steps", default_steps))) or 0.0
    total = total if total > 0 else float(default_steps)
    progress = _dict(summary.get("progress"))
    points = [p for p in (progress.get("points") or []) if _is_point(p)]
    done = min(1.0, step / total) if total else 1.0
    per_step = step_seconds(points)
    finish: float | None = None
    if per_step is not None:
        every = int(_num(config.get("eval_every", defaults.get("eval_every", 0))) or 0)
        eval_s = _num(progress.get("eval_s")) or 0.0
        per_step *= factor_at(pace, done)
        left = max(0.0, total - step) * per_step + evals_left(int(step), int(total), every) * eval_s
        finish = points[-1][0] + left
    ends = [finish] if finish is not None else []
    limit_s, elapsed_s = _num(config.get("time_limit_s")), _num(train.get("elapsed_s"))
    if limit_s and limit_s > 0 and elapsed_s is not None and points:
        started = points[-1][0] - elapsed_s  # the loop's start, on the event clock
        ends.append(started + limit_s)
        done = max(done, min(1.0, (now - started) / limit_s))
    if deadline is not None:
        ends.append(deadline)
    if finish is None:  # no step rate yet: a time limit alone is a bound, not an estimate
        return Progress(round(done, 4), None)
    eta = max(0.0, min(ends) - now)
    return Progress(round(done, 4), round(eta, 1))


def queue_starts(*, finishes: list[float], run_seconds: float | None, now: float, positions: int) -> list[float | None]:
    """Predicted start times of queue positions 1..positions (index 0 is position 1): the p-th slot to free,
    where the running runs free theirs at `finishes` and a run started at t frees its slot at t + run_seconds
    (not chained when run_seconds is None). None where no prediction reaches that far."""
    heap = [max(now, f) for f in finishes]
    heapq.heapify(heap)
    out: list[float | None] = []
    for _ in range(min(positions, QUEUE_HORIZON)):
        if not heap:
            out.append(None)
            continue
        start = heapq.heappop(heap)
        out.append(start)
        if run_seconds is not None and run_seconds > 0:
            heapq.heappush(heap, start + run_seconds)
    return out + [None] * max(0, positions - QUEUE_HORIZON)


def median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _num(value: Any) -> float | None:
    return float(value) if _is_number(value) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _is_point(p: Any) -> bool:
    return isinstance(p, list) and len(p) in (2, 3) and all(_is_number(x) for x in p)


def _span_seconds(span: Any) -> float:
    if isinstance(span, dict) and _is_number(span.get("start")) and _is_number(span.get("end")):
        return max(0.0, float(span["end"]) - float(span["start"]))
    return 0.0
