"""Where the recorded metrics are taken: grants (after their commit), Celery task failures (a signal) and the
tick's duration. Each writes to Redis through runs/metrics/record.py and never raises into its caller."""

from __future__ import annotations

from typing import Any

from runs.metrics import spec
from runs.metrics.record import Batch


def grants_record(waits: list[tuple[str, float]]) -> None:
    """After grants committed: grants by class and each slot's wait in seconds from its request to its grant
    ((run_class, seconds) per granted run, from what the grant statement returned: no query here)."""
    batch = Batch()
    for run_class, seconds in waits:
        batch.add(spec.SLOT_GRANTS, (run_class,))
        batch.observe(spec.ADMISSION_WAIT, (run_class,), [max(0.0, seconds)])
    batch.commit()


def task_failure_record(sender: Any = None, **_: Any) -> None:
    """celery.signals.task_failure receiver (connected in config/celery_app.py)."""
    name = getattr(sender, "name", None) or "unknown"
    Batch().add(spec.TASK_FAILURES, (str(name)[:200],)).commit()
