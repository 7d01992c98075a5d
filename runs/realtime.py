"""Real-time fan-out: after a transaction commits, send run events and dashboard updates to Channels groups.

Group `run.<id>` gets {"type": "run.event", "event": {run, seq, ts, type, data}}; group `dashboard` gets
{"type": "dashboard.update", "update": {...}} (shapes in docs/api.md). Publishing never fails the caller.
"""
from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)

DASHBOARD_GROUP = "dashboard"


def run_group(run_id: int) -> str:
    return f"run.{run_id}"


def group_send_now(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:  # noqa: BLE001 - a lost live update is repaired by replay/snapshot; never fail the write
        logger.warning("group_send to %s failed", group, exc_info=True)


def group_send_after_commit(group: str, message: dict[str, Any]) -> None:
    """Send once the current transaction commits (immediately when not in one); dropped on rollback."""
    transaction.on_commit(lambda: group_send_now(group, message))


def run_event_publish(event: dict[str, Any]) -> None:
    group_send_after_commit(run_group(event["run"]), {"type": "run.event", "event": event})


def dashboard_publish(update: dict[str, Any]) -> None:
    group_send_after_commit(DASHBOARD_GROUP, {"type": "dashboard.update", "update": update})
