"""Where the recorded metrics are taken: grants (after their commit), Celery task failures (a signal) and the
tick's duration. Each writes to Redis through runs/metrics/record.py and never raises into its caller."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runs.metrics import spec
from runs.metrics.record import Batch


def grants_record(waits: list[tuple[str, datetime]], now: datetime) -> None:
    """After a grant pass committed: grants by class and each slot's wait from its request to `now`
    ((run_class, requested_at) per granted run: what the grant statement returned, no query here)."""
    batch = Batch()
    for run_class, requested_at in waits:
        batch.add(spec.SLOT_GRANTS, (run_class,))
        batch.observe(spec.ADMISSION_WAIT, (run_class,), [max(0.0, (now - requested_at).total_seconds())])
    batch.commit()


def task_failure_record(sender: Any = None, **_: Any) -> None:
    """celery.signals.task_failure receiver (connected in config/celery_app.py)."""
    name = getattr(sender, "name", None) or "unknown"
    Batch().add(spec.TASK_FAILURES, (str(name)[:200],)).commit()
