"""The run store: the two ways a lifecycle move is written, behind one interface. `OrmStore` works on any
database (a release takes the grant lock and is granted in its transaction); `PgStore` does each step in one
SQL statement on PostgreSQL (runs/slots/pg.py), and its releases commit without the grant lock. Neither
decides anything: which moves are allowed (`allowed`), the columns a move stamps (`columns`) and the effects it
implies (`effects`, stored with the move in its transaction: runs/outbox/) come from runs.core.lifecycle, the one
owner of the state machine. A single move's ORM write and its publishing are in runs/core/moves.py; other events the
platform stores are published with `run_events_publish`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from django.db import connection, transaction
from django.utils import timezone

from runs.core.events import PLATFORM_SOURCE, run_event_to_dict
from runs.core.moves import Columns, Moved, status_write
from runs.core.publish import run_event_publish
from runs.errors import InvalidTransition
from runs.models import Run, RunEvent, RunStatus, Slot
from runs.outbox.effects import RunEffect
from runs.outbox.store import effects_store
from runs.slots import pg as slots_pg
from runs.slots import store as slot_store
from runs.slots.grant import Decision, Snapshot, grant, plan

# The effects a grant of these runs at this time implies (runs.core.lifecycle.granted_effects).
GrantEffects = Callable[[list[int], datetime], list[RunEffect]]


def run_events_publish(rows: list[RunEvent]) -> None:
    """Events just stored by run_events_record, to the run's viewers (after commit)."""
    for row in rows:
        run_event_publish(run_event_to_dict(row))


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
        effects: Sequence[RunEffect],
        probe: bool = False,
    ) -> tuple[Run | None, Snapshot | None]:
        """Move the run to a finished `status` if it is in `allowed`, release its slot (taking the grant lock
        first unless `releases_unlocked`) and store the move's `effects`. Returns the run (carrying
        `previous_status`; None when the move is refused: nothing written) and, with `probe` (releases_unlocked,
        autocommit), the grant snapshot when this session took the grant lock right after the release committed:
        the caller must then run a catch-up pass on it (`catch_up_pass(first=...)`, which releases the lock);
        else None."""
        ...

    def grant(self, *, now: datetime, allowed: list[str], columns: Columns, effects: GrantEffects) -> list[Moved]:
        """One grant pass under the lock the caller holds: hold the decided slots, move their runs to `starting`,
        store the effects of their grant."""
        ...

    def grant_pending(self) -> bool:
        """Whether a grant pass would grant anything now (read only, no lock)."""
        ...

    def catch_up_pass(
        self,
        *,
        now: datetime,
        allowed: list[str],
        columns: Columns,
        effects: GrantEffects,
        first: Snapshot | None = None,
    ) -> tuple[list[Moved], bool] | None:
        """A grant pass of its own (called outside any transaction): try the lock (None when another transaction
        holds it: nothing written), grant, commit, then check without the lock. `first`: the lock is held
        already, with this snapshot (`finish` with `probe`). Returns the moves (committed: the caller publishes
        them) and whether the check found more to grant."""
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
        effects: Sequence[RunEffect],
        probe: bool = False,
    ) -> tuple[Run | None, Snapshot | None]:
        slot_store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run_id)
        if locked.status not in allowed:
            return None, None
        previous = locked.status
        status_write(run=locked, status=status, error=error, now=now, columns=columns)
        slot_store.slot_release(run_id=run_id)
        effects_store(effects, now=now)
        locked.previous_status = previous
        return locked, None

    def grant(self, *, now: datetime, allowed: list[str], columns: Columns, effects: GrantEffects) -> list[Moved]:
        ids = [d.run_id for d in slot_store.slots_grant_locked(now=now)]
        by_id = Run.objects.select_for_update().in_bulk(ids)
        requested = dict(Slot.objects.filter(run_id__in=ids).values_list("run_id", "requested_at"))
        moved = []
        for run_id in ids:
            run = by_id[run_id]
            if run.status not in allowed:
                raise InvalidTransition(f"cannot move run {run_id} from {run.status} to starting", field="status")
            m = status_write(run=run, status=RunStatus.STARTING, error=None, now=now, columns=columns)
            moved.append(replace(m, requested_at=requested.get(run_id)))
        effects_store(effects(ids, now), now=now)
        return moved

    def grant_pending(self) -> bool:
        return bool(grant(slot_store.snapshot_load(slot_store.policy_load(fresh=True)), timezone.now()))

    def catch_up_pass(
        self,
        *,
        now: datetime,
        allowed: list[str],
        columns: Columns,
        effects: GrantEffects,
        first: Snapshot | None = None,
    ) -> tuple[list[Moved], bool] | None:
        assert first is None  # finish() never hands over a held lock here
        with transaction.atomic():
            if not slot_store.slots_try_lock():
                return None
            moved = self.grant(now=now, allowed=allowed, columns=columns, effects=effects)
        return moved, self.grant_pending()


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
        effects: Sequence[RunEffect],
        probe: bool = False,
    ) -> tuple[Run | None, Snapshot | None]:
        return slots_pg.release(
            run_id=run_id,
            status=status,
            error=error,
            allowed_from=allowed,
            source=PLATFORM_SOURCE,
            now=now,
            columns=columns,
            effects=effects,
            probe=probe,
        )

    def grant(self, *, now: datetime, allowed: list[str], columns: Columns, effects: GrantEffects) -> list[Moved]:
        decisions = _decide(slots_pg.snapshot_fetch(window=0), now)
        return self._apply(decisions, now=now, allowed=allowed, columns=columns, effects=effects)

    def grant_pending(self) -> bool:
        return bool(_decide(slots_pg.snapshot_fetch(window=0), timezone.now()))

    def catch_up_pass(
        self,
        *,
        now: datetime,
        allowed: list[str],
        columns: Columns,
        effects: GrantEffects,
        first: Snapshot | None = None,
    ) -> tuple[list[Moved], bool] | None:
        # Two round trips (one with `first`, which came with the release): the lock try (session level) with the
        # snapshot; the grants committed, the lock released and the check's snapshot.
        snapshot = first if first is not None else slots_pg.pass_begin()
        if snapshot is None:
            return None
        try:
            decisions = _decide(snapshot, now)
        except BaseException:
            slots_pg.pass_abort()
            raise
        rows, check = slots_pg.pass_finish(
            decisions=decisions,
            now=now,
            source=PLATFORM_SOURCE,
            status=RunStatus.STARTING,
            allowed_from=allowed,
            columns=columns,
            effects=effects([d.run_id for d in decisions], now),
        )
        return [_moved(r) for r in rows], bool(_decide(check, timezone.now()))

    @staticmethod
    def _apply(
        decisions: list[Decision], *, now: datetime, allowed: list[str], columns: Columns, effects: GrantEffects
    ) -> list[Moved]:
        if not decisions:
            return []
        rows = slots_pg.grants_apply(
            decisions=decisions,
            now=now,
            source=PLATFORM_SOURCE,
            status=RunStatus.STARTING,
            allowed_from=allowed,
            columns=columns,
            effects=effects([d.run_id for d in decisions], now),
        )
        return [_moved(r) for r in rows]


def _moved(row: dict[str, Any]) -> Moved:
    return Moved(
        run_id=row["id"],
        seq=row["last_seq"],
        owner_id=row["owner_id"],
        name=row["name"],
        run_class=row["run_class"],
        status=RunStatus.STARTING,
        previous=row["previous"],
        error=row["error"],
        requested_at=row["requested_at"],
    )


def _decide(snapshot: Snapshot, now: datetime) -> list[Decision]:
    """The grants for a snapshot loaded without the backfill window (the heads a pass could take). When the pass
    passed over a run that did not fit, later runs may be backfilled: decide again on a snapshot with the window
    (`Plan.passed_over` says why the first answer is otherwise the same)."""
    result = plan(snapshot, now)
    if result.passed_over:
        result = plan(slots_pg.snapshot_fetch(), now)
    return result.decisions


ORM_STORE = OrmStore()
PG_STORE = PgStore()


def run_store() -> RunStore:
    """The store for the current database: the SQL fast path on PostgreSQL, the ORM elsewhere."""
    return PG_STORE if connection.vendor == "postgresql" else ORM_STORE
