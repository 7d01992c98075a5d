"""The run store: the two ways a lifecycle move is written, behind one interface. `OrmStore` works on any
database (a release takes the grant lock and is granted in its transaction); `PgStore` does each step in one
SQL statement on PostgreSQL (runs/slots/pg.py), and its releases commit without the grant lock. Neither
decides anything: which moves are allowed (`allowed`) and which columns a move stamps (`columns`) come from
runs.lifecycle, the one owner of the state machine. Also the ORM writer of a single move and its publishing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from django.db import connection, transaction
from django.utils import timezone

from runs.errors import InvalidTransition
from runs.events import PLATFORM_SOURCE, run_event_to_dict
from runs.models import Run, RunEvent, RunStatus
from runs.realtime import dashboard_publish, run_event_publish
from runs.slots import pg as slots_pg
from runs.slots import store as slot_store
from runs.slots.grant import grant

Columns = dict[str, datetime | None]


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
            "type": "status",
            "data": {"status": moved.status, "previous": moved.previous, "error": moved.error},
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


def run_events_publish(rows: list[RunEvent]) -> None:
    """Events just stored by run_events_record, to the run's viewers (after commit)."""
    for row in rows:
        run_event_publish(run_event_to_dict(row))


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
            type="status",
            data={"status": status, "previous": previous, "error": run.error},
        )
    return Moved.of(run, status=status, previous=previous)


class RunStore(Protocol):
    releases_unlocked: bool  # True: `finish` does not take the grant lock; the grant is a separate step

    def finish(
        self,
        *,
        run_id: int,
        status: str,
        error: str,
        now: datetime,
        allowed: list[str],
        columns: Columns,
        probe: bool = False,
    ) -> tuple[Run | None, bool]:
        """Move the run to a finished `status` if it is in `allowed` and release its slot (taking the grant lock
        first unless `releases_unlocked`). Returns the run (carrying `previous_status`; None when the move is
        refused: nothing written) and, with `probe` (releases_unlocked, autocommit), whether the grant lock was
        free right after the release committed (else True)."""
        ...

    def grant(
        self, *, now: datetime, allowed: list[str], columns: Columns, try_lock: bool = False
    ) -> list[Moved] | None:
        """One grant pass: hold the decided slots, move their runs to `starting`. The caller holds the lock, or
        (`try_lock`) the pass tries to take it first: None when another transaction holds it."""
        ...

    def grant_pending(self) -> bool:
        """Whether a grant pass would grant anything now (read only, no lock)."""
        ...


class OrmStore:
    releases_unlocked = False

    def finish(
        self,
        *,
        run_id: int,
        status: str,
        error: str,
        now: datetime,
        allowed: list[str],
        columns: Columns,
        probe: bool = False,
    ) -> tuple[Run | None, bool]:
        slot_store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run_id)
        if locked.status not in allowed:
            return None, True
        previous = locked.status
        status_write(run=locked, status=status, error=error, now=now, columns=columns)
        slot_store.slot_release(run_id=run_id)
        locked.previous_status = previous
        return locked, True

    def grant(
        self, *, now: datetime, allowed: list[str], columns: Columns, try_lock: bool = False
    ) -> list[Moved] | None:
        if try_lock and not slot_store.slots_try_lock():
            return None
        ids = [d.run_id for d in slot_store.slots_grant_locked(now=now)]
        by_id = Run.objects.select_for_update().in_bulk(ids)
        moved = []
        for run_id in ids:
            run = by_id[run_id]
            if run.status not in allowed:
                raise InvalidTransition(f"cannot move run {run_id} from {run.status} to starting", field="status")
            moved.append(status_write(run=run, status=RunStatus.STARTING, error=None, now=now, columns=columns))
        return moved

    def grant_pending(self) -> bool:
        return bool(grant(slot_store.snapshot_load(slot_store.policy_load(fresh=True)), timezone.now()))


class PgStore:
    releases_unlocked = True

    def finish(
        self,
        *,
        run_id: int,
        status: str,
        error: str,
        now: datetime,
        allowed: list[str],
        columns: Columns,
        probe: bool = False,
    ) -> tuple[Run | None, bool]:
        return slots_pg.release(
            run_id=run_id,
            status=status,
            error=error,
            allowed_from=allowed,
            source=PLATFORM_SOURCE,
            now=now,
            columns=columns,
            probe=probe,
        )

    def grant(
        self, *, now: datetime, allowed: list[str], columns: Columns, try_lock: bool = False
    ) -> list[Moved] | None:
        snapshot = slots_pg.snapshot_fetch_try_lock() if try_lock else slots_pg.snapshot_fetch()
        if snapshot is None:
            return None
        decisions = grant(snapshot, now)
        if not decisions:
            return []
        rows = slots_pg.grants_apply(
            decisions=decisions,
            now=now,
            source=PLATFORM_SOURCE,
            status=RunStatus.STARTING,
            allowed_from=allowed,
            columns=columns,
        )
        return [
            Moved(
                run_id=r["id"],
                seq=r["last_seq"],
                owner_id=r["owner_id"],
                name=r["name"],
                run_class=r["run_class"],
                status=RunStatus.STARTING,
                previous=r["previous"],
                error=r["error"],
            )
            for r in rows
        ]

    def grant_pending(self) -> bool:
        return bool(grant(slots_pg.snapshot_fetch(), timezone.now()))


ORM_STORE = OrmStore()
PG_STORE = PgStore()


def run_store() -> RunStore:
    """The store for the current database: the SQL fast path on PostgreSQL, the ORM elsewhere."""
    return PG_STORE if connection.vendor == "postgresql" else ORM_STORE
