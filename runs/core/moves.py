"""One applied lifecycle move: what its `status` event and dashboard message need (`Moved`), its ORM write on a
locked run (`status_write`, the writer runs.core.lifecycle and the ORM store use), and its publishing after commit."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from runs.core.events import PLATFORM_SOURCE, STATUS
from runs.core.publish import dashboard_publish, run_event_publish
from runs.messages import status_move_data
from runs.models import Run, RunEvent

Columns = dict[str, Any]  # a move's stamped columns (runs.core.lifecycle.stamp): timestamps, cleared text fields


@dataclass(frozen=True)
class Moved:
    """One applied move: what its event and dashboard message need."""

    run_id: int
    seq: int
    owner_id: int
    name: str
    run_class: str
    status: str
    previous: str | None
    error: str
    requested_at: datetime | None = None  # a grant: when its slot was requested (the admission wait metric)

    @classmethod
    def of(cls, run: Run, *, status: str, previous: str | None) -> Moved:
        return cls(
            run_id=run.pk,
            seq=run.last_seq,
            owner_id=run.owner_id,
            name=run.name,
            run_class=run.run_class,
            status=status,
            previous=previous,
            error=run.error,
        )


def moved_publish(moved: Moved, *, ts: float) -> None:
    """The move's `status` event to the run's viewers and its line to the dashboard (both after commit)."""
    run_event_publish(
        {
            "run": moved.run_id,
            "seq": moved.seq,
            "ts": ts,
            "type": STATUS,
            "data": dict(status_move_data(status=moved.status, previous=moved.previous, error=moved.error)),
        }
    )
    dashboard_publish(
        {
            "kind": "run_status",
            "run": moved.run_id,
            "owner": moved.owner_id,
            "name": moved.name,
            "run_class": moved.run_class,
            "status": moved.status,
            "previous": moved.previous,
        }
    )


def status_write(*, run: Run, status: str, error: str | None, now: datetime, columns: Columns) -> Moved:
    """ORM write of one move on a locked run: status, stamped columns, error, and its numbered `status` event.
    The caller holds the row lock, so last_seq is current: the event is numbered here and saved with the
    status in one UPDATE (two statements instead of run_events_record's four)."""
    previous = run.status
    run.status = status
    for name, value in columns.items():
        setattr(run, name, value)
    fields = ["status", *columns]
    if error is not None:
        run.error = error
        fields.append("error")
    with transaction.atomic(savepoint=False):
        run.last_seq += 1
        run.save(update_fields=[*fields, "last_seq"])
        RunEvent.objects.create(
            run_id=run.pk,
            seq=run.last_seq,
            source=PLATFORM_SOURCE,
            ts=now,
            type=STATUS,
            data=status_move_data(status=status, previous=previous, error=run.error),
        )
    return Moved.of(run, status=status, previous=previous)
