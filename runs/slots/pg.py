"""PostgreSQL fast path of releases and grants: a release in one statement (no grant lock), and under the grant
lock the snapshot in one statement (runs/slots/pg_snapshot.py) and the grants (slots held, runs `starting`,
status events) in another (the writing statements, which store their moves' effects too: runs/slots/pg_writes.py).
A catch-up pass holds the lock at session level, outside any transaction: its lock try travels with the snapshot
(for a release's first pass, in the release's own message), and its grants with BEGIN, COMMIT, the unlock and
the check's snapshot. SQL only loads and writes: which moves are allowed, which columns a move stamps and which
effects it implies are parameters from runs.core.lifecycle (through runs/core/stores.py), and which runs get a slot is
decided by the pure `runs.slots.grant.grant` on the snapshot these queries return.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from psycopg.pq import TransactionStatus

from runs.errors import InvalidTransition
from runs.models import Run
from runs.outbox.effects import RunEffect
from runs.slots import pg_snapshot, pg_writes, prepared, store
from runs.slots.grant import BACKFILL_WINDOW, Decision, Snapshot
from runs.slots.pg_writes import Columns

logger = logging.getLogger(__name__)


def snapshot_fetch(*, exclude_run: int = 0, window: int = BACKFILL_WINDOW) -> Snapshot:
    """The grant snapshot in one round trip: the caller holds the grant lock (else it is a read-only check).
    `window`: how many waiting runs per class beyond the class budget (0: only the heads a pass could take)."""
    return pg_snapshot.fetch(exclude_run=exclude_run, window=window)


def _require_idle() -> None:
    if connection.in_atomic_block or connection.connection.info.transaction_status != TransactionStatus.IDLE:
        raise RuntimeError("a catch-up pass runs its own statements: call it outside any transaction")


def pass_begin() -> Snapshot | None:
    """Start a catch-up pass (autocommit, outside any transaction): try the grant lock at session level and
    fetch the snapshot (window 0) in one message; the snapshot statement starts after the lock is taken, so it
    sees every grant committed under the lock before. None: another session or transaction holds the lock
    (nothing to undo). Else the caller holds the lock until `pass_finish` (or `pass_abort`) releases it."""
    connection.ensure_connection()
    _require_idle()
    sql, params, parse = pg_snapshot.query(window=0)
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT pg_try_advisory_lock(%(lock)s);\n{sql}", {**params, "lock": store.GRANT_LOCK_KEY})
            if not cursor.fetchone()[0]:
                return None
            cursor.nextset()
            return parse(cursor.fetchall()) or _fetch_again()
    except BaseException:
        pass_abort()
        raise


def pass_finish(
    *,
    decisions: list[Decision],
    now: datetime,
    source: str,
    status: str,
    allowed_from: list[str],
    columns: Columns,
    effects: Sequence[RunEffect],
) -> tuple[list[dict[str, Any]], Snapshot]:
    """End a catch-up pass in one message: its grants and their `effects` in a transaction of their own
    (`BEGIN; grants; COMMIT`), the lock released, and the snapshot again without the lock (window 0): what the
    check after the commit decides on. Returns the moved runs (as `grants_apply`) and that snapshot."""
    sql, params, parse = pg_snapshot.query(window=0)
    params["lock"] = store.GRANT_LOCK_KEY
    parts = ["SELECT pg_advisory_unlock(%(lock)s)", sql]
    if decisions:
        apply_sql, apply_params = _apply_statement(decisions, now, source, status, allowed_from, columns, effects)
        params.update(apply_params)
        parts = ["BEGIN", apply_sql, "COMMIT", *parts]
    try:
        with connection.cursor() as cursor:
            cursor.execute(";\n".join(parts), params)
            rows: list[tuple] = []
            if decisions:
                cursor.nextset()
                rows = cursor.fetchall()
                cursor.nextset()
                cursor.nextset()
            if not cursor.fetchone()[0]:
                raise RuntimeError("a catch-up pass ended without holding the grant lock")
            cursor.nextset()
            check = parse(cursor.fetchall()) or _fetch_again()
    except BaseException:
        pass_abort()
        raise
    moved = _moved(rows, [d.run_id for d in decisions], status, allowed_from) if decisions else []
    return moved, check


def pass_abort() -> None:
    """A catch-up pass failed: roll back what is open and release the lock. If that fails too, the session is
    closed: PostgreSQL releases a session's locks when it ends, so the lock is never left held."""
    try:
        with connection.cursor() as cursor:
            if connection.connection.info.transaction_status != TransactionStatus.IDLE:
                cursor.execute("ROLLBACK")
            cursor.execute("SELECT pg_advisory_unlock(%s)", [store.GRANT_LOCK_KEY])
    except Exception:  # noqa: BLE001 - the caller raises its own error; this one must not hide it
        logger.warning("grant pass: releasing the lock failed; closing the session", exc_info=True)
        connection.close()


def _fetch_again() -> Snapshot:
    pg_snapshot.policy_for_grant_reload()  # the settings changed since the cached policy
    return pg_snapshot.fetch(window=0)


def _run_from_row(names: list[str], values: tuple) -> Run:
    """A Run instance from a RETURNING row, with the same field conversions a queryset applies."""
    row = dict(zip(names, values))
    fields = Run._meta.concrete_fields
    converted = []
    for f in fields:
        assert f.column is not None  # concrete fields always have a column
        value = row[f.column]
        for convert in f.get_db_converters(connection):
            value = convert(value, f, connection)
        converted.append(value)
    run = Run.from_db(connection.alias, [f.attname for f in fields], converted)
    run.previous_status = row["previous_status"]
    return run


def release(
    *,
    run_id: int,
    status: str,
    error: str,
    allowed_from: list[str],
    source: str,
    now: datetime,
    columns: Columns,
    effects: Sequence[RunEffect],
    probe: bool = False,
) -> tuple[Run | None, Snapshot | None]:
    """Finish a run (status, finished_at, error, numbered `status` event, slot deleted, the move's `effects`
    stored) in one statement, without the grant lock: granting the freed capacity is a separate step
    (runs.core.lifecycle.grants_catch_up). The Run (None when the run's status does not allow the move: the caller
    decides, no-op or error) carries `previous_status`.

    `probe` (autocommit only): the same message then commits, tries the grant lock at session level and fetches
    the snapshot (window 0), as `pass_begin` does. A snapshot back: this session holds the lock, and the caller
    must run the pass on it (`pass_finish` or `pass_abort` release the lock). None: a holder had the lock then,
    and that holder's check after it released the lock sees this release."""
    params: dict[str, Any] = {
        "run": run_id,
        "status": status,
        "error": error,
        "allowed": allowed_from,
        "source": source,
        "now": now,
        "lock": store.GRANT_LOCK_KEY,
    }
    sql = prepared.statement(pg_writes.release_text(columns, effects, params)).sql()
    parse = None
    if probe:
        # One simple-query message runs as one implicit transaction up to the COMMIT; the lock try runs after it.
        snapshot_sql, snapshot_params, parse = pg_snapshot.query(window=0)
        params.update(snapshot_params)
        sql += f";\nCOMMIT;\nSELECT pg_try_advisory_lock(%(lock)s);\n{snapshot_sql}"
    held = False
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            names = [c.name for c in cursor.description]
            values = cursor.fetchone()
            snapshot = None
            if parse is not None:
                cursor.nextset()  # the COMMIT
                cursor.nextset()
                held = bool(cursor.fetchone()[0])
                cursor.nextset()
                if held:
                    snapshot = parse(cursor.fetchall()) or _fetch_again()
        if values is None:
            return None, snapshot
        if dict(zip(names, values))["events_added"] != 1:
            raise RuntimeError(f"run {run_id}: status event not stored")
        return _run_from_row(names, values), snapshot
    except BaseException:
        if held:
            pass_abort()
        raise


def _apply_statement(
    decisions: list[Decision],
    now: datetime,
    source: str,
    status: str,
    allowed_from: list[str],
    columns: Columns,
    effects: Sequence[RunEffect],
) -> tuple[str, dict[str, Any]]:
    ids = [d.run_id for d in decisions]
    params: dict[str, Any] = {
        "placements": [json.dumps(list(d.placement)) for d in decisions],
        "now": now,
        "ids": ids,
        "n": len(ids),
        "source": source,
        "status": status,
        "allowed": allowed_from,
    }
    return prepared.statement(pg_writes.apply_text(columns, effects, params)).sql(), params


_MOVED = ("id", "last_seq", "owner_id", "name", "run_class", "error", "previous", "requested_at")  # r.id onwards


def _moved(rows: list[tuple], ids: list[int], status: str, allowed_from: list[str]) -> list[dict[str, Any]]:
    """One dict per moved run from the grant statement's rows; InvalidTransition when it wrote nothing."""
    slots_held, events = (rows[0][0], rows[0][1]) if rows else (0, 0)
    moved = [dict(zip(_MOVED, r[2:])) for r in rows if r[2] is not None]
    if slots_held != len(ids) or len(moved) != len(ids) or events != len(ids):
        raise InvalidTransition(
            f"cannot move runs {ids} to {status}: found {slots_held} waiting slots and "
            f"{len(moved)} runs in {allowed_from}",
            field="status",
        )
    return moved


def grants_apply(
    *,
    decisions: list[Decision],
    now: datetime,
    source: str,
    status: str,
    allowed_from: list[str],
    columns: Columns,
    effects: Sequence[RunEffect],
) -> list[dict[str, Any]]:
    """Mark the decided slots held and move their runs to `status` (`starting`) with a numbered `status` event
    each and their `effects` stored, in one statement, in the caller's transaction (which holds the grant lock).
    Returns one dict per moved run; InvalidTransition (nothing written) when a slot is no longer waiting or a run
    may not move."""
    sql, params = _apply_statement(decisions, now, source, status, allowed_from, columns, effects)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return _moved(rows, [d.run_id for d in decisions], status, allowed_from)


__all__ = ["grants_apply", "pass_abort", "pass_begin", "pass_finish", "release", "snapshot_fetch"]
