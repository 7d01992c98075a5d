"""The grant snapshot on PostgreSQL in one statement: held slots, each class's FIFO heads, the alive nodes'
capacity and the settings row's version, as rows of one shape. SQL only loads: which runs get a slot is decided
by the pure `runs.slots.grant` on what this returns (runs/core/stores.py).

Cheap to load again and again (a grant pass and the check after it each load one): every part is an index seek
bounded by the policy (held slots: at most max_total; heads: per class `head_budget` plus `window`), and the JSON
columns come back as text and are parsed once per distinct value (most runs share their kind's default demand,
every held run on one node shares its placement), so a pass does not re-parse the same bundles.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connection

from runs.slots import columns, prepared, usage
from runs.slots.grant import HeldSlot, Snapshot, WaitingSlot
from runs.slots.policy import CLASSES, Policy, policy_effective
from runs.slots.resources import Res

# Grants read the policy under the lock, but re-compute it only when the settings row changed: its version
# (row id, xmin, updated_at) comes back with every snapshot, so a new limit still applies to the next grant.
_lock = threading.Lock()
_grant_policy: tuple[str | None, tuple[int, int | None], Policy] | None = None

VERSION_SQL = (
    "(SELECT xmin::text || ':' || id::text || ':' || updated_at::text FROM runs_concurrencysettings "
    "ORDER BY id LIMIT 1)"
)

# Parts (first column): 0 a held slot, 1 a waiting head, 2 an alive node, 3 the settings version, 4 a membership of
# an owner of parts 0-1 in a group with a team quota (%(teams)s; none without quotas); the last column is the owner.
# Held slots and counts exclude %(excluded)s (0: none): the snapshot as it would be once that run is released.
# LIMIT mirrors Snapshot.head_budget (min(free slots, class headroom)) plus %(window)s later runs for backfill: per
# class, or per owner in the classes ordered per owner (fair share, per-user limit, team quotas), whose owners come
# from a skip scan of slot_owner_idx per class (`owners`: one index seek per owner and one per class; none for
# classes without a budget).
SNAPSHOT_SQL = f"""WITH RECURSIVE
held_rows AS (SELECT run_id, run_class, granted_at, time_limit_seconds, demand, placement, owner_id FROM runs_slot
              WHERE state = 'held' AND run_id <> %(excluded)s),
held AS (SELECT run_class, count(*)::int AS n FROM held_rows GROUP BY run_class),
budget AS (SELECT c.run_class, c.per_owner,
                  GREATEST(0, LEAST(%(max_total)s::int - (SELECT coalesce(sum(n), 0) FROM held)::int,
                                    c.lim - coalesce(h.n, 0)))::int AS b
           FROM unnest(%(classes)s::text[], %(limits)s::int[], %(per_owner)s::bool[]) AS c(run_class, lim, per_owner)
           LEFT JOIN held h ON h.run_class = c.run_class),
fair AS (SELECT ARRAY(SELECT run_class FROM budget WHERE per_owner AND b > 0) AS cs),
owners AS (SELECT f.run_class, f.owner_id FROM unnest((SELECT cs FROM fair)::text[]) AS c(run_class)
           CROSS JOIN LATERAL (SELECT s.run_class, s.owner_id FROM runs_slot s
                               WHERE s.state = 'waiting' AND s.run_class = c.run_class
                               ORDER BY s.state, s.run_class, s.owner_id LIMIT 1) f
           UNION ALL
           SELECT n.run_class, n.owner_id FROM owners o CROSS JOIN LATERAL (
             SELECT s.run_class, s.owner_id FROM runs_slot s
             WHERE s.state = 'waiting' AND s.run_class = o.run_class AND s.owner_id > o.owner_id
             ORDER BY s.state, s.run_class, s.owner_id LIMIT 1) n),
heads AS (SELECT w.* FROM budget CROSS JOIN LATERAL (
            SELECT s.run_class, s.run_id, s.requested_at, s.demand, s.strategy, s.time_limit_seconds, s.owner_id
            FROM runs_slot s
            WHERE s.state = 'waiting' AND s.run_class = budget.run_class AND s.run_id <> %(excluded)s
              AND NOT budget.per_owner
            ORDER BY s.requested_at, s.run_id
            LIMIT CASE WHEN budget.b > 0 THEN budget.b + %(window)s ELSE 0 END) w
          UNION ALL
          SELECT f.* FROM owners o JOIN budget ON budget.run_class = o.run_class AND budget.b > 0
          CROSS JOIN LATERAL (
            SELECT s.run_class, s.run_id, s.requested_at, s.demand, s.strategy, s.time_limit_seconds, s.owner_id
            FROM runs_slot s
            WHERE s.state = 'waiting' AND s.run_class = o.run_class AND s.owner_id = o.owner_id
              AND s.run_id <> %(excluded)s
            ORDER BY s.requested_at, s.run_id
            LIMIT budget.b + %(window)s) f)
SELECT 0, run_id, run_class::text, granted_at, time_limit_seconds, demand::text, placement::text, owner_id
FROM held_rows
UNION ALL SELECT 1, run_id, run_class, requested_at, time_limit_seconds, demand::text, strategy, owner_id FROM heads
UNION ALL SELECT 2, NULL, node_id, NULL, NULL, total::text, NULL, NULL FROM runs_clusternode WHERE alive
UNION ALL SELECT 3, NULL, {VERSION_SQL}, NULL, NULL, NULL, NULL, NULL
UNION ALL SELECT 4, m.user_id, g.name::text, NULL, NULL, NULL, NULL, NULL
FROM auth_user_groups m JOIN auth_group g ON g.id = m.group_id
WHERE cardinality(%(teams)s::text[]) > 0 AND g.name = ANY(%(teams)s::text[])
  AND m.user_id IN (SELECT owner_id FROM held_rows UNION SELECT owner_id FROM heads)"""


def policy_params(policy: Policy, *, window: int) -> dict[str, Any]:
    return {
        "max_total": policy.max_total,
        "classes": list(CLASSES),
        "limits": [policy.classes[c].limit for c in CLASSES],
        # Classes ordered per owner load each owner's FIFO prefix: owners found by a skip scan of slot_owner_idx.
        "per_owner": [policy.per_owner(c) for c in CLASSES],
        "teams": list(policy.quotas.names),  # groups with a quota: the owners' memberships come back as part 4
        "window": window,
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
        cursor.execute(f"SELECT {VERSION_SQL}, (SELECT raw::text FROM runs_concurrencysettings ORDER BY id LIMIT 1)")
        version, raw_text = cursor.fetchone()
    raw = json.loads(raw_text) if raw_text else {}
    defaults = (settings.SLOTS_DEFAULT_MAX_TOTAL, settings.SLOTS_DEFAULT_INTERACTIVE_RESERVE)
    policy = policy_effective(
        raw if isinstance(raw, dict) else {}, default_max_total=defaults[0], default_reserve=defaults[1]
    )
    with _lock:
        _grant_policy = (version, defaults, policy)
    return version, policy


@functools.lru_cache(maxsize=4096)
def _bundles(text: str | None) -> tuple[Res, ...]:
    return columns.demand_of(json.loads(text) if text else [])


@functools.lru_cache(maxsize=4096)
def _nodes(text: str | None) -> tuple[str, ...]:
    return columns.placement_of(json.loads(text) if text else [])


@functools.lru_cache(maxsize=256)
def _node_total(text: str | None) -> Res:
    return columns.node_total_of(json.loads(text) if text else {})


def _snapshot_from(rows: list[tuple], policy: Policy) -> tuple[Snapshot, str | None]:
    """The Snapshot from the statement's rows (any order), and the settings version they carried."""
    held = {k: 0 for k in CLASSES}
    running: list[HeldSlot] = []
    heads: list[tuple] = []
    capacity: dict[str, Res] = {}
    groups: dict[int, list[str]] = {}
    version = None
    for part, run_id, name, at, limit, demand, extra, owner in rows:
        if part == 0:
            held[name] = held.get(name, 0) + 1
            running.append(HeldSlot(run_id, name, at, limit, _bundles(demand), _nodes(extra), owner))
        elif part == 1:
            heads.append((at, run_id, name, demand, extra, limit, owner))
        elif part == 2:
            capacity[name] = _node_total(demand)
        elif part == 4:
            groups.setdefault(run_id, []).append(name)
        else:
            version = name
    running.sort(key=lambda h: h.run_id)
    heads.sort(key=lambda h: (h[0], h[1]))
    waiting: dict[str, list[WaitingSlot]] = {}
    for at, run_id, name, demand, strategy, limit, owner in heads:
        slot = WaitingSlot(run_id, at, _bundles(demand), strategy or "PACK", limit, owner)
        waiting.setdefault(name, []).append(slot)
    capacity = dict(sorted(capacity.items()))
    teams = {owner: tuple(sorted(groups[owner])) for owner in sorted(groups)}
    snapshot = Snapshot(policy, held, waiting, capacity, tuple(running), groups=teams)
    return snapshot, version


def query(*, exclude_run: int = 0, window: int) -> tuple[str, dict[str, Any], Callable[[list[tuple]], Snapshot | None]]:
    """The snapshot statement, its parameters, and what turns its rows into the Snapshot: None when the settings
    changed since the cached policy (then `policy_for_grant_reload` and `fetch`). For callers that send it in
    one message with other statements."""
    version, policy = _cached_policy() or policy_for_grant_reload()
    params = {"excluded": exclude_run, **policy_params(policy, window=window)}

    def parse(rows: list[tuple]) -> Snapshot | None:
        snapshot, seen = _snapshot_from(rows, policy)
        return usage.with_usage(snapshot) if seen == version else None

    return prepared.statement(SNAPSHOT_SQL).sql(), params, parse


def fetch(*, exclude_run: int = 0, window: int) -> Snapshot:
    """The snapshot in one round trip (fetched again when the settings changed since the cached policy)."""
    for _ in range(2):
        sql, params, parse = query(exclude_run=exclude_run, window=window)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            snapshot = parse(cursor.fetchall())
        if snapshot is not None:
            return snapshot
        policy_for_grant_reload()
    raise RuntimeError("concurrency settings changed while holding the grant lock")


__all__ = ["fetch", "policy_for_grant_reload", "policy_params", "query"]
