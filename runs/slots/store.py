"""Database side of slots: the grant lock, the effective policy (cached per process), and loading the
queue snapshot that the pure `grant` function decides on. Grant cost is independent of queue depth: it
counts held slots and seeks each class's head through the (state, run_class, requested_at, run) index.

On PostgreSQL releases commit without the grant lock, so whoever held the lock may have kept a releaser from
granting (its `slots_try_lock` failed): every transaction that took the lock runs the catch-up registered by
runs.core.lifecycle (`after_unlock_register`) once it has committed, or rolled back (runs/slots/pgengine).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count

from runs.models import ClusterNode, ConcurrencySettings, Slot, SlotState
from runs.slots.columns import capacity_of, held_slot, waiting_slot
from runs.slots.fairness import owner_prefix
from runs.slots.grant import Decision, HeldSlot, Snapshot, WaitingSlot, grant
from runs.slots.policy import CLASSES, Policy, policy_effective
from runs.slots.resources import Res
from runs.slots.teams import with_groups
from runs.slots.usage import with_usage

# Key of the transaction-scoped advisory lock that serializes grants on PostgreSQL ("RLslots").
GRANT_LOCK_KEY = 0x524C736C6F7473

_cache_lock = threading.Lock()
_cached: tuple[float, Policy] | None = None

_after_unlock: Callable[[], object] | None = None


def after_unlock_register(hook: Callable[[], object]) -> None:
    """What runs after the commit of every PostgreSQL transaction that took the grant lock (runs.core.lifecycle)."""
    global _after_unlock
    _after_unlock = hook


def _after_commit() -> None:
    if _after_unlock is not None:
        _after_unlock()


def lock_held() -> bool:
    """Whether the current transaction holds the grant lock: on PostgreSQL, its on-commit hook is registered (Django
    forgets it at commit or rollback, as PostgreSQL forgets the lock); on SQLite, any transaction (BEGIN IMMEDIATE)."""
    if connection.vendor != "postgresql":
        return connection.in_atomic_block
    return lock_held_on(connection)


def lock_held_on(conn: Any) -> bool:
    """Whether this PostgreSQL connection's transaction took the grant lock (its on-commit hook is registered)."""
    return any(hook[1] is _after_commit for hook in conn.run_on_commit)


def after_rollback() -> None:
    """A transaction that took the lock rolled back (runs/slots/pgengine): catch up as after a commit."""
    _after_commit()


def slots_lock() -> None:
    """Serialize with every other grant until the current transaction ends: a transaction-scoped advisory lock on
    PostgreSQL; on SQLite the transaction holds the write lock already (BEGIN IMMEDIATE serializes writers)."""
    if not connection.in_atomic_block:
        raise RuntimeError("slots_lock() must be called inside transaction.atomic()")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [GRANT_LOCK_KEY])
        lock_taken()


def slots_try_lock() -> bool:
    """slots_lock without waiting: False when another transaction holds the lock (PostgreSQL)."""
    if not connection.in_atomic_block:
        raise RuntimeError("slots_try_lock() must be called inside transaction.atomic()")
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [GRANT_LOCK_KEY])
        got = bool(cursor.fetchone()[0])
    if got:
        lock_taken()
    return got


def lock_taken() -> None:
    """The current transaction just took the grant lock (PostgreSQL): catch up once it ends (one hook each)."""
    if connection.vendor == "postgresql" and not lock_held():
        transaction.on_commit(_after_commit, robust=True)  # an error there is logged; the tick catches up


def policy_stored_raw() -> dict:
    row = ConcurrencySettings.objects.order_by("pk").values_list("raw", flat=True).first()
    return row if isinstance(row, dict) else {}


def policy_load(*, fresh: bool = False) -> Policy:
    """Effective policy; cached for SLOTS_POLICY_CACHE_SECONDS so every process sees a change within that time.
    Grants pass fresh=True: they read the stored row under the grant lock, so limits apply at once."""
    global _cached
    now = time.monotonic()
    with _cache_lock:
        if not fresh and _cached is not None and now - _cached[0] < settings.SLOTS_POLICY_CACHE_SECONDS:
            return _cached[1]
    policy = policy_effective(
        policy_stored_raw(),
        default_max_total=settings.SLOTS_DEFAULT_MAX_TOTAL,
        default_reserve=settings.SLOTS_DEFAULT_INTERACTIVE_RESERVE,
    )
    with _cache_lock:
        _cached = (now, policy)
    return policy


def policy_forget() -> None:
    global _cached
    with _cache_lock:
        _cached = None


def _counts_by_class(rows) -> dict[str, int]:
    counts = {k: 0 for k in CLASSES}
    for row in rows:
        counts[row["run_class"]] = row["n"]
    return counts


def held_counts() -> dict[str, int]:
    """Held slots per class (what a grant decides on; at most max_total rows)."""
    return _counts_by_class(Slot.objects.filter(state=SlotState.HELD).values("run_class").annotate(n=Count("run_id")))


def slot_counts() -> dict[str, dict[str, int]]:
    """Held and waiting slots per class in one query: {"held": {...}, "waiting": {...}}."""
    rows = list(Slot.objects.values("state", "run_class").annotate(n=Count("run_id")))
    return {
        state: _counts_by_class(r for r in rows if r["state"] == state) for state in (SlotState.HELD, SlotState.WAITING)
    }


def capacity_load() -> dict[str, Res]:
    """Alive nodes' total resources as the tick last read them from Ray ({}: not known yet)."""
    return capacity_of(ClusterNode.objects.filter(alive=True).order_by("node_id").values_list("node_id", "total"))


def held_load() -> tuple[HeldSlot, ...]:
    """Every held slot with its bundles, placement and latest end (at most max_total rows)."""
    rows = (
        Slot.objects.filter(state=SlotState.HELD)
        .order_by("run_id")
        .values_list("run_id", "run_class", "granted_at", "time_limit_seconds", "demand", "placement", "owner_id")
    )
    return tuple(held_slot(*row) for row in rows)


def snapshot_load(policy: Policy) -> Snapshot:
    """Held slots (counts per class, bundles, placement, ends), alive capacity, and per class only as many FIFO
    waiting runs as one grant pass could use (`Snapshot.head_window`); the owners' usage and quota'd groups."""
    running = held_load()
    held = {k: 0 for k in CLASSES}
    for h in running:
        held[h.run_class] = held.get(h.run_class, 0) + 1
    capacity = capacity_load()
    probe = Snapshot(policy=policy, held=held)
    waiting: dict[str, list[WaitingSlot]] = {}
    columns = ("run_class", "run_id", "requested_at", "demand", "strategy", "time_limit_seconds", "owner_id")
    fifo = Slot.objects.filter(state=SlotState.WAITING).order_by("requested_at", "run_id").values_list(*columns)
    windows = {k: w for k in CLASSES if (w := probe.head_window(k)) > 0}
    per_owner = [k for k in windows if policy.per_owner(k)]  # each owner's FIFO prefix
    heads = [fifo.filter(run_class=k)[:w] for k, w in windows.items() if k not in per_owner]
    if connection.features.supports_slicing_ordering_in_compound and len(heads) > 1:
        rows = list(heads[0].union(*heads[1:], all=True))  # one round trip: each part is an index seek
    else:
        rows = [row for part in heads for row in part]
    rows += [r for k in per_owner for r in owner_prefix(fifo.filter(run_class=k), windows[k], lambda r: r[-1])]
    rows.sort(key=lambda r: (r[2], r[1]))
    for run_class, run_id, *rest in rows:
        waiting.setdefault(run_class, []).append(waiting_slot(run_id, *rest))
    return with_groups(
        with_usage(Snapshot(policy=policy, held=held, waiting=waiting, capacity=capacity, running=running))
    )


def slots_grant_locked(*, now: datetime) -> list[Decision]:
    """One grant pass; the caller holds slots_lock(). Marks the chosen slots held and returns the decisions."""
    assert connection.in_atomic_block
    decisions = grant(snapshot_load(policy_load(fresh=True)), now)
    for d in decisions:
        Slot.objects.filter(run_id=d.run_id, state=SlotState.WAITING).update(
            state=SlotState.HELD, granted_at=now, placement=list(d.placement)
        )
    return decisions


def slot_demand(resources: Any) -> dict[str, Any]:
    """The slot columns of a run's demand (Run.resources, the demand JSON written at submit)."""
    resources = resources if isinstance(resources, dict) else {}
    bundles = resources.get("bundles")
    return {
        "demand": [
            {k: b.get(k, 0) for k in ("role", "CPU", "GPU", "memory") if k in b}
            for b in (bundles if isinstance(bundles, list) else [])
            if isinstance(b, dict)
        ],
        "strategy": resources.get("strategy") or "PACK",
    }


def slot_enqueue(
    *,
    run_id: int,
    run_class: str,
    now: datetime,
    resources: Any = None,
    time_limit_seconds: int | None = None,
    owner: int | None = None,
) -> None:
    """A waiting slot for the run, carrying its demand (`resources`: Run.resources), strategy, time limit, owner."""
    Slot.objects.update_or_create(
        run_id=run_id,
        defaults={
            "run_class": run_class,
            "state": SlotState.WAITING,
            "requested_at": now,
            "granted_at": None,
            "placement": [],
            **{"time_limit_seconds": time_limit_seconds, "owner_id": owner or 0},
            **slot_demand(resources),
        },
    )


def slot_release(*, run_id: int) -> bool:
    """Delete the run's slot row (waiting or held). True when one existed."""
    deleted, _ = Slot.objects.filter(run_id=run_id).delete()
    return deleted > 0


__all__ = [
    "GRANT_LOCK_KEY",
    "after_unlock_register",
    "capacity_load",
    "held_load",
    "lock_held",
    "lock_taken",
    "slots_try_lock",
    "held_counts",
    "policy_forget",
    "policy_load",
    "policy_stored_raw",
    "slot_enqueue",
    "slot_release",
    "slots_grant_locked",
    "slots_lock",
    "slot_counts",
    "snapshot_load",
    "transaction",
]
