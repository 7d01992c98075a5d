"""The grant function before team quotas, kept verbatim (git show dc4b947:runs/slots/grant.py, only this
docstring replaced) as the oracle of the team-quota property test: with no `team_quotas` set, runs/slots/grant.py
must decide exactly as this did, whatever the fairness options and the owners' groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from runs.slots.fairness import ClassFairness, effective_priority, overdue
from runs.slots.policy import CLASSES, Policy
from runs.slots.resources import MILLI, Res, free_after, pack, total

INTERACTIVE = "interactive"
# Waiting runs a loader fetches per class beyond what the class rules allow at once: later runs a pass may
# consider for backfill when heads do not fit. Keeps the snapshot (and a grant's cost) flat in queue depth.
BACKFILL_WINDOW = 16

CLASS_LIMIT_REACHED = "class_limit_reached"
GLOBAL_LIMIT_REACHED = "global_limit_reached"
RESERVE_PROTECTED = "reserve_protected"
GPU_LIMIT_REACHED = "gpu_limit_reached"
INSUFFICIENT_RESOURCES = "insufficient_resources"
HIGHER_PRIORITY_WAITING = "higher_priority_waiting"
USER_LIMIT_REACHED = "user_limit_reached"
PENDING_REASONS = (
    CLASS_LIMIT_REACHED,
    GLOBAL_LIMIT_REACHED,
    RESERVE_PROTECTED,
    GPU_LIMIT_REACHED,
    INSUFFICIENT_RESOURCES,
    HIGHER_PRIORITY_WAITING,
    USER_LIMIT_REACHED,
)


@dataclass(frozen=True)
class WaitingSlot:
    run_id: int
    requested_at: datetime
    demand: tuple[Res, ...] = ()
    strategy: str = "PACK"
    time_limit_seconds: int | None = None
    owner: int = 0  # the run's owner (user id): fair share and max_running_per_user


@dataclass(frozen=True)
class HeldSlot:
    """A granted run as admission sees it: what it holds, where, and until when at the latest."""

    run_id: int
    run_class: str
    granted_at: datetime | None
    time_limit_seconds: int | None
    demand: tuple[Res, ...] = ()
    placement: tuple[str, ...] = ()
    owner: int = 0

    @property
    def latest_end(self) -> datetime | None:
        return latest_end(self.granted_at, self.time_limit_seconds)


def latest_end(start: datetime | None, time_limit_seconds: int | None) -> datetime | None:
    if start is None or time_limit_seconds is None:
        return None
    return start + timedelta(seconds=time_limit_seconds)


@dataclass(frozen=True)
class Snapshot:
    """Held counts per class, each class's waiting runs in FIFO order (only the heads a pass can use), the alive
    nodes' capacity and the held runs (their bundles, placement and latest end)."""

    policy: Policy
    held: dict[str, int]
    waiting: dict[str, list[WaitingSlot]] = field(default_factory=dict)
    capacity: dict[str, Res] = field(default_factory=dict)
    running: tuple[HeldSlot, ...] = ()
    usage: Mapping[int, float] = field(default_factory=dict)  # owner -> weighted decayed dominant share

    def head_budget(self, run_class: str) -> int:
        """How many heads of a class a grant pass could take at most (class rules only)."""
        free_total = self.policy.max_total - sum(self.held.values())
        headroom = self.policy.classes[run_class].limit - self.held.get(run_class, 0)
        return max(0, min(free_total, headroom))

    def head_window(self, run_class: str) -> int:
        """How many waiting runs of a class a loader must fetch: the budget plus the backfill window."""
        budget = self.head_budget(run_class)
        return budget + BACKFILL_WINDOW if budget > 0 else 0

    @property
    def free(self) -> dict[str, Res]:
        """Free resources per alive node: capacity minus every held run's bundles where they are placed."""
        return free_after(self.capacity, [(h.demand, h.placement) for h in self.running])

    def held_gpus(self) -> dict[str, int]:
        """GPUs (thousandths) held per class."""
        out = {k: 0 for k in CLASSES}
        for h in self.running:
            out[h.run_class] = out.get(h.run_class, 0) + total(h.demand).gpu
        return out

    def held_by_owner(self) -> dict[tuple[str, int], int]:
        """Held runs per (class, owner): what `max_running_per_user` counts."""
        out: dict[tuple[str, int], int] = {}
        for h in self.running:
            out[(h.run_class, h.owner)] = out.get((h.run_class, h.owner), 0) + 1
        return out


def class_order(queue: list[WaitingSlot], rules: ClassFairness, usage: Mapping[int, float]) -> list[WaitingSlot]:
    """A class's waiting runs in the order the class takes them: FIFO, or with fair share by owner usage (an
    owner without recent usage first), then FIFO, so one owner's runs keep their own order."""
    if not rules.fair_share:
        return queue
    return sorted(queue, key=lambda w: (usage.get(w.owner, 0.0), w.requested_at, w.run_id))


def user_blocked(rules: ClassFairness, held: Mapping[tuple[str, int], int], run_class: str, owner: int) -> bool:
    limit = rules.max_running_per_user
    return limit is not None and held.get((run_class, owner), 0) >= limit


def order_key(policy: Policy, run_class: str, run: WaitingSlot, now: datetime) -> tuple[bool, float, datetime, int]:
    """The head's place across classes (smaller first): overdue runs first, then effective priority, FIFO."""
    rules = policy.fairness.of(run_class)
    waited = (now - run.requested_at).total_seconds()
    priority = effective_priority(policy.classes[run_class].priority, rules, waited)
    return (not overdue(rules, waited), -priority, run.requested_at, run.run_id)


@dataclass(frozen=True)
class Decision:
    run_id: int
    run_class: str
    granted_at: datetime
    placement: tuple[str, ...] = ()
    backfill_until: datetime | None = None  # set when granted as backfill: the reserved head's shadow time


@dataclass(frozen=True)
class Plan:
    decisions: list[Decision]
    reserved: int | None = None  # the reserved head's run id
    shadow: datetime | None = None  # when it could start at the latest (None: not known)
    # Candidates taken in grant order but not granted (did not fit, or not backfillable). 0: the pass took only
    # runs it granted, so it used no waiting run beyond each class's `head_budget`: a snapshot without the
    # backfill window (loaders' window 0) gives the same decisions.
    passed_over: int = 0


def blocking_reason(policy: Policy, held: dict[str, int], run_class: str) -> str | None:
    """Why a run of this class cannot be granted given these held counts (None: capacity exists). All slots
    held is `global_limit_reached` before it is `reserve_protected`: the reserve holds a run back only while a
    slot is free and kept for interactive runs (with a reserve of 0, never)."""
    if held.get(run_class, 0) >= policy.classes[run_class].limit:
        return CLASS_LIMIT_REACHED
    if sum(held.values()) >= policy.max_total:
        return GLOBAL_LIMIT_REACHED
    others = sum(n for k, n in held.items() if k != INTERACTIVE)
    if run_class != INTERACTIVE and others >= policy.borrowable:
        return RESERVE_PROTECTED
    return None


def gpu_blocked(policy: Policy, held_gpus: Mapping[str, int], run_class: str, demand: Sequence[Res]) -> bool:
    """True when granting this run would take its class past its `gpu_limit` (None: no limit)."""
    limit = policy.classes[run_class].gpu_limit
    need = total(demand).gpu
    return limit is not None and need > 0 and held_gpus.get(run_class, 0) + need > limit * MILLI


Ending = tuple[datetime | None, Sequence[Res], Sequence[str]]


def shadow_time(
    demand: Sequence[Res], strategy: str, free: Mapping[str, Res], endings: Sequence[Ending], now: datetime
) -> datetime | None:
    """The earliest time the run would fit if held runs end at their latest ends, in order (now: it fits now).
    None when that is not known: it needs a run without a time limit to end, or never fits."""
    if pack(demand, free, strategy) is not None:
        return now
    left = dict(free)
    for end, bundles, placement in sorted((e for e in endings if e[0] is not None), key=lambda e: e[0]):  # type: ignore[arg-type, return-value]
        for bundle, node in zip(bundles, placement):
            if node in left:
                left[node] = left[node] + bundle
        if pack(demand, left, strategy) is not None:
            return max(end, now) if end is not None else None
    return None


def plan(snapshot: Snapshot, now: datetime) -> Plan:
    """The grants of one pass, in grant order, and the reservation it made (see the module docstring)."""
    policy = snapshot.policy
    if not snapshot.capacity:
        return Plan([])  # capacity not known yet: nothing can be placed
    held = {k: snapshot.held.get(k, 0) for k in CLASSES}
    gpus = snapshot.held_gpus()
    free = snapshot.free
    endings: list[Ending] = [(h.latest_end, h.demand, h.placement) for h in snapshot.running]
    cursor = {k: 0 for k in CLASSES}
    fair = policy.fairness
    queues = {k: class_order(snapshot.waiting.get(k, []), fair.of(k), snapshot.usage) for k in CLASSES}
    by_owner = snapshot.held_by_owner()
    reserved: tuple[int, datetime | None] | None = None
    decisions: list[Decision] = []
    passed_over = 0
    while sum(held.values()) < policy.max_total:
        best: tuple[bool, float, datetime, int] | None = None
        best_class = ""
        for run_class in CLASSES:
            queue = queues[run_class]
            if cursor[run_class] >= len(queue) or blocking_reason(policy, held, run_class) is not None:
                continue  # empty, or skipped whole: a class at its limit never blocks the others
            while cursor[run_class] < len(queue) and user_blocked(
                fair.of(run_class), by_owner, run_class, queue[cursor[run_class]].owner
            ):
                cursor[run_class] += 1  # its owner is at the class's per-user limit: it stays queued
                passed_over += 1
            if cursor[run_class] >= len(queue):
                continue
            head = queue[cursor[run_class]]
            if gpu_blocked(policy, gpus, run_class, head.demand):
                continue  # the class's GPU limit: a class rule, skipped whole like the others
            key = order_key(policy, run_class, head, now)
            if best is None or key < best:
                best, best_class = key, run_class
        if best is None:
            break
        run = queues[best_class][cursor[best_class]]
        cursor[best_class] += 1
        placement = pack(run.demand, free, run.strategy)
        end = latest_end(now, run.time_limit_seconds)
        if reserved is not None:  # backfill: fits now and is gone by the head's shadow time
            if placement is None or reserved[1] is None or end is None or end > reserved[1]:
                passed_over += 1
                continue
        elif placement is None:
            if pack(run.demand, snapshot.capacity, run.strategy) is not None:
                reserved = (run.run_id, shadow_time(run.demand, run.strategy, free, endings, now))
            passed_over += 1
            continue
        for bundle, node in zip(run.demand, placement):
            free[node] = free[node] - bundle
        held[best_class] += 1
        by_owner[(best_class, run.owner)] = by_owner.get((best_class, run.owner), 0) + 1
        gpus[best_class] = gpus.get(best_class, 0) + total(run.demand).gpu
        endings.append((end, run.demand, placement))
        decisions.append(
            Decision(
                run_id=run.run_id,
                run_class=best_class,
                granted_at=now,
                placement=tuple(placement),
                backfill_until=reserved[1] if reserved else None,
            )
        )
    if reserved is None:
        return Plan(decisions, passed_over=passed_over)
    return Plan(decisions, reserved=reserved[0], shadow=reserved[1], passed_over=passed_over)


def grant(snapshot: Snapshot, now: datetime) -> list[Decision]:
    """Runs to grant now, in grant order. Pure: the caller applies the decisions under the grant lock."""
    return plan(snapshot, now).decisions
