"""How a run's pace changes over its length, learned from finished runs. Pure: no database, no clock.

An RL run rarely keeps the pace of its first steps. Groups whose rewards all agree carry no signal and are
filtered and sampled again, and their share moves as the policy learns. In the platform's default runs it fell
from about 46% to 25%, and the step time with it, from 1.2 s to 0.9 s. A finish ETA from the recent step rate
alone is then too long early in a run, by 20-40% at a tenth of the way.

So the summary of every run keeps a pace profile: `marks`, one [tenth, step, clock] per tenth of the run, where
`clock` is the run's training seconds so far, evaluations taken out (`marks_fold`). For tenth j, a finished
run's factor is its pace over the rest of the run after j over its pace in the tenth before j. A running
run's step time is multiplied by the median factor, at its tenth, of the latest finished runs of its kind
(`pace_factors`; runs/scheduling/finishes.py reads them), when at least PACE_MIN_RUNS of them have one.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

TENTHS = 10
# Finished runs needed before a factor is used (fewer: the recent step rate alone).
PACE_MIN_RUNS = 3
# A factor outside this range is clamped: one odd reference run must not make an ETA absurd.
FACTOR_MIN, FACTOR_MAX = 0.5, 2.0


def marks_fold(marks: Any, *, step: float, total: float | None, clock: float, restarted: bool) -> list[list[float]]:
    """`marks` after a train event at `step` of `total` with the run's training `clock`: a mark is added when
    the step enters a new tenth. A restarted run (resumed from a checkpoint) starts its marks again: its clock
    restarts too, and a profile is only compared within itself."""
    kept = [] if restarted else [m for m in (marks or []) if _is_mark(m)]
    share = step / total if total and total > 0 else math.nan  # the job's numbers: anything a float can be
    if not math.isfinite(share) or not math.isfinite(clock):
        return kept
    tenth = min(TENTHS, max(0, math.floor(share * TENTHS)))
    if not kept or tenth > kept[-1][0]:
        kept.append([tenth, step, round(clock, 4)])
    return kept


def run_factors(marks: list[list[float]]) -> dict[int, float]:
    """One finished run's factor at each tenth j (1..TENTHS-1) its profile covers: (seconds per step from its
    mark at j to its last mark) / (seconds per step from the mark before j to the one at j)."""
    marks = [m for m in marks if _is_mark(m)]
    if len(marks) < 3 or marks[-1][0] != TENTHS:
        return {}
    last = marks[-1]
    out: dict[int, float] = {}
    for before, at in zip(marks, marks[1:-1], strict=False):
        pace_before = _pace(before, at)
        pace_after = _pace(at, last)
        if pace_before and pace_after is not None:
            out[int(at[0])] = pace_after / pace_before
    return out


def pace_factors(profiles: list[Any]) -> dict[int, float]:
    """Per tenth: the median factor of the finished runs' `marks` (latest first) that have one there, when at
    least PACE_MIN_RUNS do; clamped to [FACTOR_MIN, FACTOR_MAX]. A missing tenth means: no correction there."""
    by_tenth: dict[int, list[float]] = {}
    for marks in profiles:
        if isinstance(marks, list):
            for tenth, factor in run_factors(marks).items():
                by_tenth.setdefault(tenth, []).append(factor)
    return {
        tenth: min(FACTOR_MAX, max(FACTOR_MIN, statistics.median(factors)))
        for tenth, factors in sorted(by_tenth.items())
        if len(factors) >= PACE_MIN_RUNS
    }


def factor_at(factors: dict[int, float] | None, done: float) -> float:
    """The factor for a run `done` (0..1) of the way: that of the tenth it is in (the first tenth's before one
    tenth is done, the last but one's in the last tenth); 1.0 where there is none."""
    if not factors:
        return 1.0
    tenth = min(TENTHS - 1, max(1, int(done * TENTHS)))
    return factors.get(tenth, 1.0)


def _pace(start: list[float], end: list[float]) -> float | None:
    steps = end[1] - start[1]
    return max(0.0, end[2] - start[2]) / steps if steps > 0 else None


def _is_mark(m: Any) -> bool:
    return (
        isinstance(m, list)
        and len(m) == 3
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) and x == x for x in m)
    )
