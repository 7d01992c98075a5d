"""How the lifecycle hands work to Celery: the tasks it names (not imports: runs.tasks, the entry points, sits
above runs/lifecycle.py) and the hand-off once the current transaction commits."""

from __future__ import annotations

import threading
from typing import Any

from celery import current_app
from django.db import transaction

TASK_DISPATCH = "runs.tasks.dispatch_run"
TASK_STOP = "runs.tasks.stop_run"
TASK_FOLLOWUPS = "runs.tasks.run_followups"
_discovery_lock = threading.Lock()


def task_named(name: str) -> Any:
    """A Celery task by name. A process that is not a worker (web, scripts) has not yet run the autodiscovery a
    worker runs at start-up; the first lookup runs it (once: concurrent first lookups wait for it)."""
    if name not in current_app.tasks:
        with _discovery_lock:
            if name not in current_app.tasks:
                current_app.loader.import_default_modules()
    return current_app.tasks[name]


def task_after_commit(name: str, *args: Any) -> None:
    """Hand a task to Celery once the current transaction commits (nothing is sent if it rolls back)."""
    transaction.on_commit(lambda: task_named(name).delay(*args))
