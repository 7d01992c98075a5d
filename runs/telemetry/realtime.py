"""What the dashboard publisher sends (runs/core/publish.py coalesces and calls it; formats: docs/realtime.md): the
board rows of changed runs (`run.update`) and the slots + queue change (`slots.update`), read when sent."""

from __future__ import annotations

from typing import Any

from runs.core.publish import DASHBOARD_GROUP, Move, group_send_now
from runs.messages import RunUpdateLayer, SlotsUpdateLayer
from runs.selectors import slots_snapshot
from runs.telemetry.dashboard import board_runs, queue_change


def runs_update_send(run_ids: Any) -> None:
    """Read the runs now and send each board row; `last_seq` lets consumers drop stale reads."""
    for row, owner_id, last_seq in board_runs(run_ids):
        group_send_now(
            DASHBOARD_GROUP, RunUpdateLayer(type="run.update", run=row, owner_id=owner_id, last_seq=last_seq)
        )


def slots_update_message(*, joined: list[Move], left: list[Move], resync_at: float | None = None) -> SlotsUpdateLayer:
    """The `slots.update` layer message: slot counts and the queue change, a size and a query count that do
    not depend on the queue length."""
    return SlotsUpdateLayer(
        type="slots.update", slots=slots_snapshot(), queue=queue_change(joined=joined, left=left), resync_at=resync_at
    )


def slots_update_send(*, joined: list[Move], left: list[Move], resync_at: float | None = None) -> None:
    group_send_now(DASHBOARD_GROUP, slots_update_message(joined=joined, left=left, resync_at=resync_at))
