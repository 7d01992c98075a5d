"""The queue's order as grant passes take it, for everyone who shows or predicts it (positions, the ETA, the
priority factors of GET /api/runs/<id>/priority/): each class's waiting runs in the class's order (`class_order`:
FIFO, or fair share), merged across classes by their heads' keys (`order_key`: overdue first, then class priority
plus aging, then request time and id), exactly as `runs.slots.grant.plan` merges them. Class limits and resources
are left out: they decide when, not in which order. With every fairness option off it is the seed order (class
priority, then FIFO). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from runs.slots.fairness import effective_priority, overdue
from runs.slots.grant import WaitingSlot, class_order, order_key
from runs.slots.policy import CLASSES, Policy


def queue_order(
    policy: Policy, waiting: Mapping[str, Sequence[WaitingSlot]], usage: Mapping[int, float], now: datetime
) -> list[tuple[str, WaitingSlot]]:
    """Every waiting run (each class's list in FIFO order) with its class, in grant order."""
    queues = {k: class_order(list(waiting.get(k, ())), policy.fairness.of(k), usage) for k in CLASSES}
    cursor = {k: 0 for k in CLASSES}
    heads = {k: order_key(policy, k, q[0], now) for k, q in queues.items() if q}
    out: list[tuple[str, WaitingSlot]] = []
    while heads:
        run_class = min(heads, key=lambda k: heads[k])
        queue = queues[run_class]
        out.append((run_class, queue[cursor[run_class]]))
        cursor[run_class] += 1
        if cursor[run_class] < len(queue):
            heads[run_class] = order_key(policy, run_class, queue[cursor[run_class]], now)
        else:
            del heads[run_class]
    return out


def owner_rank(usage: Mapping[int, float], owners: Sequence[int], owner: int) -> int:
    """1-based rank of `owner` among `owners` by usage (least first; ties share the better rank)."""
    mine = usage.get(owner, 0.0)
    return 1 + sum(1 for o in set(owners) if usage.get(o, 0.0) < mine)


def factors(
    policy: Policy,
    run_class: str,
    run: WaitingSlot,
    *,
    usage: Mapping[int, float],
    class_owners: Sequence[int],
    held_by_owner: Mapping[tuple[str, int], int],
    now: datetime,
) -> dict[str, Any]:
    """What places a waiting run in the order, factor by factor, and the key they combine into."""
    rules = policy.fairness.of(run_class)
    waited = max(0.0, (now - run.requested_at).total_seconds())
    priority = policy.classes[run_class].priority
    late = overdue(rules, waited)
    held = held_by_owner.get((run_class, run.owner), 0)
    return {
        "run_class": run_class,
        "class_priority": priority,
        "waited_seconds": round(waited, 1),
        "aging": {
            "per_hour": rules.aging_per_hour,
            "cap": rules.aging_cap,
            "bonus": round(effective_priority(priority, rules, waited) - priority, 3),
        },
        "effective_priority": round(effective_priority(priority, rules, waited), 3),
        "max_wait": {"seconds": rules.max_wait_seconds, "overdue": late},
        "fair_share": {
            "enabled": rules.fair_share,
            "usage": round(usage.get(run.owner, 0.0), 6),
            "weight": policy.fairness.weight(run.owner),
            "rank": owner_rank(usage, class_owners, run.owner) if rules.fair_share else None,
            "owners": len(set(class_owners)),
        },
        "user_limit": {
            "max_running_per_user": rules.max_running_per_user,
            "held": held,
            "reached": rules.max_running_per_user is not None and held >= rules.max_running_per_user,
        },
        "order": "across classes: overdue (past max_wait) first, then effective priority (class priority + aging) "
        "descending, then request time, then id; within the class: "
        + ("owner's fair-share usage ascending, then FIFO" if rules.fair_share else "FIFO")
        + "; a run whose owner reached the class's per-user limit is skipped until one of its runs ends",
        "key": [
            not late,
            -round(effective_priority(priority, rules, waited), 3),
            run.requested_at.isoformat(),
            run.run_id,
        ],
    }
