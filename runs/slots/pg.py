"""PostgreSQL fast path of releases and grants: a release in one statement (no grant lock), and under the grant
lock the snapshot in one statement and the grants applied (slots held, runs `starting`, status events) in
another. SQL only loads and writes: which moves are allowed and which columns a move stamps are parameters from
runs.lifecycle (through runs/stores.py), and which runs get a slot is decided by the pure
`runs.slots.grant.grant` on the snapshot these queries return.
"""

from __future__ import annotations

import json
import threading
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils.dateparse import parse_datetime

from runs.errors import InvalidTransition
from runs.models import Run
from runs.slots import store
from runs.slots.grant import BACKFILL_WINDOW, Decision, Snapshot, WaitingSlot
from runs.slots.policy import CLASSES, Policy, policy_effective

# Grants read the policy under the lock, but re-compute it only when the settings row changed: its version
# (row id, xmin, updated_at) comes back with every snapshot, so a new limit still applies to the next grant.
_lock = threading.Lock()
_grant_policy: tuple[str | None, tuple[int, int | None], Policy] | None = None

_VERSION_SQL = (
    "(SELECT xmin::text || ':' || id::text || ':' || updated_at::text FROM runs_concurrencysettings "
    "ORDER BY id LIMIT 1)"
)

# Held counts and, per class, the FIFO heads one pass could take: LIMIT mirrors Snapshot.head_budget
# (min(free slots, class headroom)), so every part is an index seek and the cost does not grow with the queue.
# %(run)s is excluded (0: none): the snapshot as it would be once that run is released.
_SNAPSHOT_CTES = """
held_rows AS (SELECT run_id, run_class, granted_at, time_limit_seconds, demand, placement FROM runs_slot
              WHERE state = 'held' AND run_id <> %(run)s),
held AS (SELECT run_class, count(*)::int AS n FROM held_rows GROUP BY run_class),
budget AS (SELECT c.run_class,
                  GREATEST(0, LEAST(%(max_total)s::int - (SELECT coalesce(sum(n), 0) FROM held)::int,
                                    c.lim - coalesce(h.n, 0)))::int AS b
           FROM unnest(%(classes)s::text[], %(limits)s::int[]) AS c(run_class, lim)
           LEFT JOIN held h ON h.run_class = c.run_class),
heads AS (SELECT w.* FROM budget CROSS JOIN LATERAL (
            SELECT s.run_class, s.run_id, s.requested_at, s.demand, s.strategy, s.time_limit_seconds FROM runs_slot s
            WHERE s.state = 'waiting' AND s.run_class = budget.run_class AND s.run_id <> %(run)s
            ORDER BY s.requested_at, s.run_id
            LIMIT CASE WHEN budget.b > 0 THEN budget.b + %(window)s ELSE 0 END) w)"""

# Also loaded with every snapshot: each held slot (bundles, placement, latest end) and the alive nodes' totals.
_SNAPSHOT_COLUMNS = f"""
(SELECT array_agg(run_class ORDER BY run_class) FROM held) AS held_classes,
(SELECT array_agg(n ORDER BY run_class) FROM held) AS held_counts,
(SELECT jsonb_agg(jsonb_build_array(run_id, run_class, granted_at, time_limit_seconds, demand, placement)
                  ORDER BY run_id) FROM held_rows) AS held_slots,
(SELECT jsonb_agg(jsonb_build_array(node_id, total) ORDER BY node_id) FROM runs_clusternode WHERE alive)
  AS capacity,
(SELECT array_agg(run_class ORDER BY requested_at, run_id) FROM heads) AS head_classes,
(SELECT array_agg(run_id ORDER BY requested_at, run_id) FROM heads) AS head_ids,
(SELECT array_agg(requested_at ORDER BY requested_at, run_id) FROM heads) AS head_times,
(SELECT jsonb_agg(jsonb_build_array(demand, strategy, time_limit_seconds) ORDER BY requested_at, run_id)
   FROM heads) AS head_demands,
{_VERSION_SQL} AS policy_version"""

# A release: one statement, no global lock. The run row lock (FOR UPDATE) and the allowed-from check serialize
# moves of one run; the slot row is deleted in the same statement, so the release commits as one small write.
_RELEASE_SQL = """WITH
cur AS (SELECT id, status FROM runs_run WHERE id = %(run)s FOR UPDATE),
upd AS (UPDATE runs_run r SET status = %(status)s, {columns}, error = %(error)s, last_seq = r.last_seq + 1
        FROM cur WHERE r.id = cur.id AND cur.status = ANY(%(allowed)s::text[])
        RETURNING r.*, cur.status AS previous_status),
ev AS (INSERT INTO runs_runevent (run_id, seq, source, ts, type, data)
       SELECT id, last_seq, %(source)s, %(now)s, 'status',
              jsonb_build_object('status', %(status)s::text, 'previous', previous_status, 'error', %(error)s::text)
       FROM upd RETURNING 1),
rel AS (DELETE FROM runs_slot WHERE run_id IN (SELECT id FROM upd) RETURNING 1)
SELECT upd.*, (SELECT count(*) FROM ev) AS events_added FROM upd"""

_SNAPSHOT_SQL = f"WITH {_SNAPSHOT_CTES}\nSELECT {_SNAPSHOT_COLUMNS}"

_APPLY_SQL = """WITH
s AS (UPDATE runs_slot x SET state = 'held', granted_at = %(now)s, placement = p.placement
      FROM unnest(%(ids)s::bigint[], %(placements)s::jsonb[]) AS p(run_id, placement)
      WHERE x.state = 'waiting' AND x.run_id = p.run_id RETURNING x.run_id),
cur AS (SELECT id, status FROM runs_run WHERE id = ANY(%(ids)s::bigint[]) FOR UPDATE),
r AS (UPDATE runs_run x SET status = %(status)s, {columns}, last_seq = x.last_seq + 1
      FROM cur WHERE x.id = cur.id AND cur.status = ANY(%(allowed)s::text[])
      RETURNING x.id, x.last_seq, x.owner_id, x.name, x.run_class, x.error, cur.status AS previous),
e AS (INSERT INTO runs_runevent (run_id, seq, source, ts, type, data)
      SELECT id, last_seq, %(source)s, %(now)s, 'status',
             jsonb_build_object('status', %(status)s::text, 'previous', previous, 'error', error)
      FROM r RETURNING 1)
SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM e), r.id, r.last_seq, r.owner_id, r.name, r.run_class, r.error,
       r.previous
FROM (SELECT 1) AS one LEFT JOIN r ON true"""

_RUN_COLUMNS = frozenset({"granted_at", "started_at", "finished_at", "heartbeat_at"})


def _set_columns(columns: dict[str, datetime | None], params: dict[str, Any]) -> str:
    """The SET list for a move's stamped columns (names from runs.lifecycle.stamp, values as parameters)."""
    if not columns or not set(columns) <= _RUN_COLUMNS:
        raise ValueError(f"unexpected run columns {sorted(columns)}")
    for name, value in columns.items():
        params[f"col_{name}"] = value
    return ", ".join(f"{name} = %(col_{name})s" for name in sorted(columns))


def _policy_params(policy: Policy) -> dict[str, Any]:
    return {
        "max_total": policy.max_total,
        "classes": list(CLASSES),
        "limits": [policy.classes[c].limit for c in CLASSES],
        "window": BACKFILL_WINDOW,
    }


def _cached_policy() -> tuple[str | None, Policy] | None:
    with _lock:
        cached = _grant_policy
    if cached is None or cached[1] != (settings.SLOTS_DEFAULT_MAX_TOTAL, settings.SLOTS_DEFAULT_INTERACTIVE_RESERVE):
        return None
    return cached[0], cached[2]


def policy_for_grant_reload() -> tuple[str | None, Policy]:
    """Read the settings row (under the grant lock) and remember the policy with the row's version."""
    global _grant_policy
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {_VERSION_SQL}, (SELECT raw::text FROM runs_concurrencysettings ORDER BY id LIMIT 1)")
        version, raw_text = cursor.fetchone()
    raw = json.loads(raw_text) if raw_text else {}
    defaults = (settings.SLOTS_DEFAULT_MAX_TOTAL, settings.SLOTS_DEFAULT_INTERACTIVE_RESERVE)
    policy = policy_effective(
        raw if isinstance(raw, dict) else {}, default_max_total=defaults[0], default_reserve=defaults[1]
    )
    with _lock:
        _grant_policy = (version, defaults, policy)
    return version, policy


def _snapshot_from(row: dict[str, Any], policy: Policy) -> Snapshot:
    held = {k: 0 for k in CLASSES}
    for run_class, n in zip(row["held_classes"] or [], row["held_counts"] or []):
        held[run_class] = n
    running = tuple(
        store.held_slot(run_id, run_class, parse_datetime(at) if at else None, limit, demand, placement)
        for run_id, run_class, at, limit, demand, placement in _json(row["held_slots"])
    )
    waiting: dict[str, list[WaitingSlot]] = {}
    for run_class, run_id, requested_at, (demand, strategy, limit) in zip(
        row["head_classes"] or [], row["head_ids"] or [], row["head_times"] or [], _json(row["head_demands"])
    ):
        waiting.setdefault(run_class, []).append(store.waiting_slot(run_id, requested_at, demand, strategy, limit))
    capacity = store.capacity_of(_json(row["capacity"]))
    return Snapshot(policy=policy, held=held, waiting=waiting, capacity=capacity, running=running)


def _json(value: Any) -> list:
    """A jsonb aggregate as Python (psycopg decodes jsonb; a NULL aggregate is an empty list)."""
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, list) else []


def snapshot_fetch(*, exclude_run: int = 0) -> Snapshot:
    """The grant snapshot in one round trip: the caller holds the grant lock (else it is a read-only check)."""
    snapshot = _fetch(exclude_run=exclude_run, try_lock=False)
    assert snapshot is not None
    return snapshot


def snapshot_fetch_try_lock() -> Snapshot | None:
    """Try to take the grant lock and, when taken, fetch the snapshot, in one round trip: two statements in one
    message (client-side binding), so the snapshot statement starts after the lock is taken and sees every
    grant committed under it before. None when another transaction holds the lock."""
    return _fetch(exclude_run=0, try_lock=True)


def _fetch(*, exclude_run: int, try_lock: bool) -> Snapshot | None:
    cached = _cached_policy() or policy_for_grant_reload()
    for attempt in range(2):
        version, policy = cached
        params = {"run": exclude_run, "lock": store.GRANT_LOCK_KEY, **_policy_params(policy)}
        with connection.cursor() as cursor:
            if try_lock and attempt == 0:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%(lock)s);\n" + _SNAPSHOT_SQL, params)
                if not cursor.fetchone()[0]:
                    return None
                store.lock_taken()
                cursor.nextset()
            else:
                cursor.execute(_SNAPSHOT_SQL, params)
            names = [c.name for c in cursor.description]
            row = dict(zip(names, cursor.fetchone()))
        if row["policy_version"] == version:
            return _snapshot_from(row, policy)
        cached = policy_for_grant_reload()  # settings changed since cached: load it and fetch again
    raise RuntimeError("concurrency settings changed while holding the grant lock")


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
    columns: dict[str, datetime | None],
    probe: bool = False,
) -> tuple[Run | None, bool]:
    """Finish a run (status, finished_at, error, numbered `status` event, slot deleted) in one statement, without
    the grant lock: granting the freed capacity is a separate step (runs.lifecycle.grants_catch_up). The Run
    (None when the run's status does not allow the move: the caller decides, no-op or error) carries
    `previous_status`.

    `probe` (autocommit only): the same message then commits and asks whether the grant lock is free right
    after that commit (`pg_try_advisory_xact_lock` in a transaction of its own, which ends with the message).
    False: a holder had it then, and that holder's check after its own commit sees this release. Without
    `probe`, the bool is True."""
    params: dict[str, Any] = {
        "run": run_id,
        "status": status,
        "error": error,
        "allowed": allowed_from,
        "source": source,
        "now": now,
        "lock": store.GRANT_LOCK_KEY,
    }
    sql = _RELEASE_SQL.format(columns=_set_columns(columns, params))
    if probe:
        # One simple-query message runs as one implicit transaction up to the COMMIT; the probe runs after it.
        sql += ";\nCOMMIT;\nSELECT pg_try_advisory_xact_lock(%(lock)s)"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        names = [c.name for c in cursor.description]
        values = cursor.fetchone()
        lock_free = True
        if probe:
            cursor.nextset()  # the COMMIT
            cursor.nextset()
            lock_free = bool(cursor.fetchone()[0])
    if values is None:
        return None, lock_free
    if dict(zip(names, values))["events_added"] != 1:
        raise RuntimeError(f"run {run_id}: status event not stored")
    return _run_from_row(names, values), lock_free


def grants_apply(
    *,
    decisions: list[Decision],
    now: datetime,
    source: str,
    status: str,
    allowed_from: list[str],
    columns: dict[str, datetime | None],
) -> list[dict[str, Any]]:
    """Mark the decided slots held and move their runs to `status` (`starting`) with a numbered `status` event
    each, in one statement. Returns one dict per moved run."""
    ids = [d.run_id for d in decisions]
    params: dict[str, Any] = {
        "placements": [json.dumps(list(d.placement)) for d in decisions],
        "now": now,
        "ids": ids,
        "source": source,
        "status": status,
        "allowed": allowed_from,
    }
    with connection.cursor() as cursor:
        cursor.execute(_APPLY_SQL.format(columns=_set_columns(columns, params)), params)
        rows = cursor.fetchall()
    slots_held, events = (rows[0][0], rows[0][1]) if rows else (0, 0)
    moved = [
        {
            "id": r[2],
            "last_seq": r[3],
            "owner_id": r[4],
            "name": r[5],
            "run_class": r[6],
            "error": r[7],
            "previous": r[8],
        }
        for r in rows
        if r[2] is not None
    ]
    if slots_held != len(ids) or len(moved) != len(ids) or events != len(ids):
        raise InvalidTransition(
            f"cannot move runs {ids} to {status}: found {slots_held} waiting slots and "
            f"{len(moved)} runs in {allowed_from}",
            field="status",
        )
    return moved


__all__ = ["grants_apply", "policy_for_grant_reload", "release", "snapshot_fetch", "snapshot_fetch_try_lock"]
