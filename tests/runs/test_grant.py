"""Table-driven tests of the pure grant function: every slot rule, with an injected clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runs.slots.grant import (
    CLASS_LIMIT_REACHED,
    GLOBAL_LIMIT_REACHED,
    RESERVE_PROTECTED,
    Snapshot,
    WaitingSlot,
    blocking_reason,
    grant,
)
from runs.slots.policy import policy_effective
from runs.slots.resources import Res

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BIG = {"n1": Res(cpu=10**6, gpu=10**6, memory=1 << 50)}  # class rules only: resources never bind
NOW = T0 + timedelta(hours=1)


def pol(max_total: int, reserve: int | None = None, **classes: dict) -> object:
    raw: dict = {"max_total": max_total, "classes": classes}
    if reserve is not None:
        raw["interactive_reserve"] = reserve
    return policy_effective(raw, default_max_total=4)


def queue(*items: tuple[str, int, int]) -> dict[str, list[WaitingSlot]]:
    """items: (class, run id, seconds after T0 it was requested); kept FIFO per class like the loader does."""
    out: dict[str, list[WaitingSlot]] = {}
    for run_class, run_id, at in sorted(items, key=lambda i: (i[2], i[1])):
        out.setdefault(run_class, []).append(WaitingSlot(run_id=run_id, requested_at=T0 + timedelta(seconds=at)))
    return out


CASES = [
    # name, policy, held, waiting, expected grant order
    ("max_total=1: no reserve, any class may run", pol(1), {}, queue(("system", 1, 0)), [1]),
    ("max_total=1: full, nothing granted", pol(1), {"system": 1}, queue(("interactive", 2, 0)), []),
    ("max_total=1: interactive first by priority", pol(1), {}, queue(("app", 1, 0), ("interactive", 2, 5)), [2]),
    (
        "max_total=2: reserve 1 keeps one slot for interactive",
        pol(2),
        {},
        queue(("app", 1, 0), ("system", 2, 1), ("schedule", 3, 2)),
        [1],
    ),
    (
        "max_total=2: interactive uses the reserve",
        pol(2),
        {"app": 1},
        queue(("system", 1, 0), ("interactive", 2, 1)),
        [2],
    ),
    (
        "max_total=2: interactive may take both slots",
        pol(2),
        {},
        queue(("interactive", 1, 0), ("interactive", 2, 1)),
        [1, 2],
    ),
    ("max_total=2 reserve 0: others may take both", pol(2, 0), {}, queue(("app", 1, 0), ("system", 2, 1)), [1, 2]),
    (
        "borrowing: others use everything but the reserve",
        pol(8),
        {},
        queue(*[("system", i, i) for i in range(1, 10)]),
        [1, 2, 3, 4, 5, 6],
    ),
    (
        "borrowing is shared by the three non-interactive classes",
        pol(8),
        {"app": 3, "schedule": 2},
        queue(("system", 1, 0), ("system", 2, 1), ("interactive", 3, 2)),
        [3, 1],
    ),
    (
        "skipped head: a class at its limit does not block others",
        pol(4, 0, app={"limit": 1}),
        {"app": 1},
        queue(("app", 1, 0), ("system", 2, 5)),
        [2],
    ),
    (
        "skipped head keeps later heads of other classes in order",
        pol(4, 0, app={"limit": 1}),
        {},
        queue(("app", 1, 0), ("app", 2, 1), ("schedule", 3, 2), ("system", 4, 3)),
        [1, 3, 4],
    ),
    ("FIFO within one priority", pol(3, 0), {}, queue(("app", 5, 2), ("app", 3, 0), ("app", 4, 1)), [3, 4, 5]),
    ("same request time: lower id first", pol(2, 0), {}, queue(("app", 9, 0), ("app", 7, 0)), [7, 9]),
    (
        "equal priority across classes: request time decides",
        pol(4, 0, app={"priority": 15}, system={"priority": 15}),
        {},
        queue(("system", 1, 0), ("app", 2, 1), ("system", 3, 2)),
        [1, 2, 3],
    ),
    (
        "priority beats request time",
        pol(2, 0),
        {},
        queue(("system", 1, 0), ("app", 2, 9), ("interactive", 3, 20)),
        [3, 2],
    ),
    (
        "custom priority order",
        pol(1, 0, system={"priority": 99}),
        {},
        queue(("interactive", 1, 0), ("system", 2, 5)),
        [2],
    ),
    (
        "lowered limit: nothing preempted, nothing granted until below",
        pol(4, 0, app={"limit": 1}),
        {"app": 3},
        queue(("app", 1, 0)),
        [],
    ),
    (
        "lowered max_total below held: nothing granted",
        pol(2, 0),
        {"app": 2, "interactive": 1},
        queue(("interactive", 1, 0)),
        [],
    ),
    (
        "never past max_total",
        pol(3, 0),
        {"interactive": 1},
        queue(*[("interactive", i, i) for i in range(1, 6)]),
        [1, 2],
    ),
    (
        "interactive limit lower than total",
        pol(4, 1, interactive={"limit": 1}),
        {},
        queue(("interactive", 1, 0), ("interactive", 2, 1), ("app", 3, 2)),
        [1, 3],
    ),
    ("empty queue", pol(4), {}, {}, []),
]


@pytest.mark.parametrize("name,policy,held,waiting,expected", CASES, ids=[c[0] for c in CASES])
def test_grant_table(name, policy, held, waiting, expected):
    decisions = grant(Snapshot(policy=policy, held=held, waiting=waiting, capacity=BIG), NOW)
    assert [d.run_id for d in decisions] == expected
    assert all(d.granted_at == NOW for d in decisions)
    after = dict(held)
    for d in decisions:
        after[d.run_class] = after.get(d.run_class, 0) + 1
    granted_any = bool(decisions)
    if granted_any:  # whatever was granted respects every limit (held before may exceed lowered limits)
        assert sum(after.values()) <= policy.max_total
        for k, n in after.items():
            if n > held.get(k, 0):
                assert n <= policy.classes[k].limit
        others = sum(n for k, n in after.items() if k != "interactive")
        if others > sum(n for k, n in held.items() if k != "interactive"):
            assert others <= policy.borrowable


@pytest.mark.parametrize(
    "held,run_class,reason",
    [
        ({"app": 3}, "app", CLASS_LIMIT_REACHED),  # default app limit at max_total=4 is 3
        ({"app": 1, "system": 2}, "schedule", RESERVE_PROTECTED),
        ({"interactive": 4}, "interactive", CLASS_LIMIT_REACHED),
        ({"interactive": 1, "app": 3}, "interactive", GLOBAL_LIMIT_REACHED),
        ({"interactive": 1}, "app", None),
    ],
)
def test_blocking_reason(held, run_class, reason):
    assert blocking_reason(pol(4), held, run_class) == reason


@pytest.mark.parametrize(
    "reserve,held,reason",
    [
        # Every slot held: the global limit holds the eval back, whatever the reserve.
        (0, {"app": 3, "system": 1}, GLOBAL_LIMIT_REACHED),
        (1, {"app": 3, "interactive": 1}, GLOBAL_LIMIT_REACHED),
        # A free slot kept for interactive runs: only then the reserve is the reason.
        (1, {"app": 3}, RESERVE_PROTECTED),
        (0, {"app": 3}, None),
    ],
)
def test_a_system_eval_behind_app_runs_is_told_the_reason_that_holds_it(reserve, held, reason):
    assert blocking_reason(pol(4, reserve, app={"limit": 4}), held, "system") == reason
