"""The one place that decides grants: a pure function from a queue snapshot to the runs to grant now.

Rules: priority descending, then request time, then id; a class at its limit is skipped (it does not block
other classes); never past max_total; the non-interactive classes together stay within max_total - reserve;
running runs are never preempted (the function only ever adds grants).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from runs.slots.policy import CLASSES, Policy

INTERACTIVE = "interactive"

CLASS_LIMIT_REACHED = "class_limit_reached"
GLOBAL_LIMIT_REACHED = "global_limit_reached"
RESERVE_PROTECTED = "reserve_protected"
HIGHER_PRIORITY_WAITING = "higher_priority_waiting"
PENDING_REASONS = (CLASS_LIMIT_REACHED, GLOBAL_LIMIT_REACHED, RESERVE_PROTECTED, HIGHER_PRIORITY_WAITING)


@dataclass(frozen=True)
class WaitingSlot:
    run_id: int
    requested_at: datetime


@dataclass(frozen=True)
class Snapshot:
    """Held counts per class and each class's waiting runs in FIFO order (only the heads are needed:
    a class never gets more than min(free slots, its own headroom) grants at once)."""

    policy: Policy
    held: dict[str, int]
    waiting: dict[str, list[WaitingSlot]] = field(default_factory=dict)

    def head_budget(self, run_class: str) -> int:
        """How many heads of a class a grant pass could take at most (what a loader must fetch)."""
        free_total = self.policy.max_total - sum(self.held.values())
        headroom = self.policy.classes[run_class].limit - self.held.get(run_class, 0)
        return max(0, min(free_total, headroom))


@dataclass(frozen=True)
class Decision:
    run_id: int
    run_class: str
    granted_at: datetime


def blocking_reason(policy: Policy, held: dict[str, int], run_class: str) -> str | None:
    """Why a run of this class cannot be granted given these held counts (None: capacity exists)."""
    if held.get(run_class, 0) >= policy.classes[run_class].limit:
        return CLASS_LIMIT_REACHED
    others = sum(n for k, n in held.items() if k != INTERACTIVE)
    if run_class != INTERACTIVE and others >= policy.borrowable:
        return RESERVE_PROTECTED
    if sum(held.values()) >= policy.max_total:
        return GLOBAL_LIMIT_REACHED
    return None


def grant(snapshot: Snapshot, now: datetime) -> list[Decision]:
    """Runs to grant now, in grant order. Pure: the caller applies the decisions under the grant lock."""
    policy = snapshot.policy
    held = {k: snapshot.held.get(k, 0) for k in CLASSES}
    cursor = {k: 0 for k in CLASSES}
    queues = {k: snapshot.waiting.get(k, []) for k in CLASSES}
    decisions: list[Decision] = []
    while sum(held.values()) < policy.max_total:
        best: tuple[int, datetime, int] | None = None
        best_class = ""
        for run_class in CLASSES:
            queue = queues[run_class]
            if cursor[run_class] >= len(queue) or blocking_reason(policy, held, run_class) is not None:
                continue  # empty, or skipped whole: a class at its limit never blocks the others
            head = queue[cursor[run_class]]
            key = (-policy.classes[run_class].priority, head.requested_at, head.run_id)
            if best is None or key < best:
                best, best_class = key, run_class
        if best is None:
            break
        decisions.append(Decision(run_id=best[2], run_class=best_class, granted_at=now))
        cursor[best_class] += 1
        held[best_class] += 1
    return decisions
