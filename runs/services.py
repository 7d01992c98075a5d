"""The control plane's write operations, in one import for the views (API, dashboard, admin): submitting runs
(runs/execution/submit.py), lifecycle moves (runs/core/lifecycle.py; resume: runs/scheduling/enqueue.py), the tick's
sweeps (runs/execution/sweeps.py) and the concurrency settings (runs/scheduling/concurrency.py). Nothing here but the
names; each lives in its own module."""

from __future__ import annotations

from runs.core.lifecycle import (
    TRANSITIONS,
    run_cancel,
    run_finish,
    run_status_change,
    run_transition,
    slots_grant,
)
from runs.execution.submit import NAME_MAX, TIME_LIMIT_MAX, run_demand, run_resources, run_submit
from runs.execution.sweeps import runs_enforce_time_limits, runs_reclaim_stale
from runs.scheduling.concurrency import settings_update
from runs.scheduling.enqueue import run_resume

__all__ = [
    "NAME_MAX",
    "TIME_LIMIT_MAX",
    "TRANSITIONS",
    "run_cancel",
    "run_finish",
    "run_resume",
    "run_status_change",
    "run_demand",
    "run_resources",
    "run_submit",
    "run_transition",
    "runs_enforce_time_limits",
    "runs_reclaim_stale",
    "settings_update",
    "slots_grant",
]
