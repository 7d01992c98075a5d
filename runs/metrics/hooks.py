"""Where the recorded metrics are taken: grants (after their commit), Celery task failures (a signal) and the
tick's duration. Each writes to Redis through runs/metrics/record.py and never raises into its caller."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import DatabaseError

from runs.metrics import spec
from runs.metrics.record import Batch
from runs.models import Slot

logger = logging.getLogger(__name__)


def grants_record(run_ids: list[int], now: datetime) -> None:
    """After a grant pass committed: grants by class and each slot's wait from its request to `now`."""
    try:
        rows = list(Slot.objects.filter(run_id__in=run_ids).values_list("run_class", "requested_at"))
    except DatabaseError as exc:  # metrics never fail a grant
        logger.warning("metrics: grants not recorded: %s", exc)
        return
    batch = Batch()
    for run_class, requested_at in rows:
        batch.add(spec.SLOT_GRANTS, (run_class,))
        batch.observe(spec.ADMISSION_WAIT, (run_class,), [max(0.0, (now - requested_at).total_seconds())])
    batch.commit()


def task_failure_record(sender: Any = None, **_: Any) -> None:
    """celery.signals.task_failure receiver (connected in config/celery_app.py)."""
    name = getattr(sender, "name", None) or "unknown"
    Batch().add(spec.TASK_FAILURES, (str(name)[:200],)).commit()
