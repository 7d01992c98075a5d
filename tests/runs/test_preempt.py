"""Table-driven tests of victim selection (runs/slots/preempt.py) and of the preemption settings' validation
(runs/slots/preempt_policy.py, through runs/slots/policy.py), with an injected clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runs.slots.grant import HeldSlot, Snapshot, WaitingSlot, grant
from runs.slots.policy import CLASSES, PolicyError, policy_effective, policy_merge, policy_validate
from runs.slots.preempt import HeldState, choose
from runs.slots.preempt_policy import CAP_DEFAULT, GRACE_DEFAULT
from runs.slots.resources import Res

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
GIB = 1 << 30
TWO_NODES = {"a": Res(2000, 0, 8 * GIB), "b": Res(2000, 0, 8 * GIB)}
ON = {"interactive": {"preempts": True}, "schedule": {"preemptible": True}, "system": {"preemptible": True}}


def pol(max_total: int = 2, reserve: int = 0, **classes: dict) -> object:
    raw = {"max_total": max_total, "interactive_reserve": reserve, "classes": {**ON, **classes}}
    return policy_effective(raw, default_max_total=2)


def cpu(milli: int) -> tuple[Res, ...]:
    return (Res(milli, 0, GIB),)


def held(run_id: int, run_class: str, node: str = "a", *, granted: int = 0, need: int = 1000) -> HeldSlot:
    return HeldSlot(run_id, run_class, T0 + timedelta(seconds=granted), None, cpu(need), (node,), owner=run_id)


def waiting(run_id: int, at: int = 100, need: int = 1000) -> WaitingSlot:
    return WaitingSlot(run_id, T0 + timedelta(seconds=at), cpu(need), owner=50 + run_id)


def snap(policy, running, wait, capacity=TWO_NODES) -> Snapshot:
    counts = {k: sum(1 for h in running if h.run_class == k) for k in CLASSES}
    return Snapshot(policy, counts, wait, capacity, tuple(running))


def ck(seconds: int) -> HeldState:
    return HeldState(checkpoint_at=T0 + timedelta(seconds=seconds))


FULL = [held(1, "schedule", "a", granted=10), held(2, "schedule", "b", granted=20)]
CASES = [
    # name, policy, held, waiting, states, expected [(victim, for)]
    (
        "off by default: nothing",
        policy_effective({"max_total": 2}, default_max_total=2),
        FULL,
        {"interactive": [waiting(9)]},
        {},
        [],
    ),
    (
        "only preempts without preemptible: nothing",
        pol(schedule={"preemptible": False}, system={}),
        FULL,
        {"interactive": [waiting(9)]},
        {},
        [],
    ),
    ("one slot needed: one victim, the latest grant", pol(), FULL, {"interactive": [waiting(9)]}, {}, [(2, 9)]),
    (
        "most recent checkpoint before the latest grant",
        pol(),
        FULL,
        {"interactive": [waiting(9)]},
        {1: ck(900), 2: ck(300)},
        [(1, 9)],
    ),
    ("a checkpoint before none", pol(), FULL, {"interactive": [waiting(9)]}, {1: ck(5)}, [(1, 9)]),
    (
        "lowest priority first",
        pol(),
        [held(1, "system", "a"), held(2, "schedule", "b", granted=50)],
        {"interactive": [waiting(9)]},
        {2: ck(999)},
        [(1, 9)],
    ),
    (
        "never for equal priority",
        pol(schedule={"preemptible": True, "preempts": True}),
        FULL,
        {"schedule": [waiting(9)]},
        {},
        [],
    ),
    (
        "never for lower priority",
        pol(system={"preempts": True}),
        [held(1, "schedule"), held(2, "app", "b")],
        {"system": [waiting(9)]},
        {},
        [],
    ),
    (
        "not preemptible classes are never victims",
        pol(),
        [held(1, "app", "a"), held(2, "app", "b")],
        {"interactive": [waiting(9)]},
        {},
        [],
    ),
    (
        "a run at its daily cap is never chosen",
        pol(),
        FULL,
        {"interactive": [waiting(9)]},
        {2: HeldState(preemptions_today=CAP_DEFAULT)},
        [(1, 9)],
    ),
    (
        "a run not running (starting, stopping) is never chosen",
        pol(),
        FULL,
        {"interactive": [waiting(9)]},
        {2: HeldState(stoppable=False)},
        [(1, 9)],
    ),
    (
        "everyone at the cap: nothing",
        pol(),
        FULL,
        {"interactive": [waiting(9)]},
        {1: HeldState(preemptions_today=3), 2: HeldState(preemptions_today=3)},
        [],
    ),
    ("a fitting waiting run needs nobody", pol(max_total=3), FULL, {"interactive": [waiting(9, need=500)]}, {}, []),
    # Resources: a slot is free but no node has 2 CPUs free. The preferred candidate (latest grant) shares node a
    # with an app run, so freeing it is not enough: it is spared, and the run on node b alone is the victim.
    (
        "resources: only the victim whose node makes it fit",
        pol(max_total=4),
        [held(1, "schedule", "a", granted=90, need=500), held(3, "app", "a"), held(2, "schedule", "b", granted=10)],
        {"interactive": [waiting(9, need=2000)]},
        {},
        [(2, 9)],
    ),
    (
        "two victims on one node when one is not enough, no more",
        pol(max_total=4),
        [
            held(1, "schedule", "a", granted=30),
            held(2, "schedule", "a", granted=20),
            held(3, "schedule", "b", granted=10),
        ],
        {"interactive": [waiting(9, need=2000)]},
        {},
        [(1, 9), (2, 9)],
    ),
    ("no set fits: no victim", pol(max_total=4), FULL, {"interactive": [waiting(9, need=5000)]}, {}, []),
    (
        "two waiting runs, one victim each",
        pol(),
        FULL,
        {"interactive": [waiting(8, at=1), waiting(9, at=2)]},
        {},
        [(2, 8), (1, 9)],
    ),
    (
        "under way: no second victim for the same run",
        pol(),
        FULL,
        {"interactive": [waiting(9)]},
        {2: HeldState(preempting_for=9)},
        [],
    ),
    (
        "under way for one: the next waiting run gets the other",
        pol(),
        FULL,
        {"interactive": [waiting(8, at=1), waiting(9, at=2)]},
        {2: HeldState(preempting_for=8)},
        [(1, 9)],
    ),
    (
        "the reserve counts: a slot kept for interactive runs makes room",
        pol(max_total=3, reserve=1),
        FULL,
        {"interactive": [waiting(9)]},
        {},
        [],
    ),
    (
        "class limit of the preempting class is kept",
        pol(interactive={"preempts": True, "limit": 1}),
        [held(1, "interactive", "a"), held(2, "schedule", "b")],
        {"interactive": [waiting(9)]},
        {},
        [],
    ),
]


@pytest.mark.parametrize("name,policy,running,wait,states,expected", CASES, ids=[c[0] for c in CASES])
def test_victims(name, policy, running, wait, states, expected):
    victims = choose(snap(policy, running, wait), NOW, states)
    assert [(v.run_id, v.for_run) for v in victims] == expected
    for v in victims:
        assert policy.classes[v.run_class].priority < policy.classes[v.for_class].priority
        assert str(v.for_run) in v.reason


def test_victims_free_exactly_what_the_grant_then_grants():
    """After the victims' slots are released, the grant pass grants the run they were chosen for."""
    policy = pol()
    before = snap(policy, FULL, {"interactive": [waiting(9)]})
    assert grant(before, NOW) == []
    victims = choose(before, NOW, {})
    left = [h for h in FULL if h.run_id not in {v.run_id for v in victims}]
    after = snap(policy, left, {"interactive": [waiting(9)], "schedule": [waiting(v.run_id, at=0) for v in victims]})
    assert [d.run_id for d in grant(after, NOW)] == [9]


def test_dry_run_question_stops_at_the_first_head():
    two = snap(pol(), FULL, {"interactive": [waiting(8, at=1), waiting(9, at=2)]})
    assert [(v.run_id, v.for_run) for v in choose(two, NOW, {}, every_head=False)] == [(2, 8)]


def test_settings_defaults_and_effective_values():
    off = policy_effective({}, default_max_total=4).preemption
    assert (off.on, off.grace_seconds, off.max_per_run_per_day) == (False, GRACE_DEFAULT, CAP_DEFAULT)
    raw = {"preempt_grace_seconds": 30, "max_preemptions_per_run_per_day": 0, "classes": ON}
    on = policy_effective(raw, default_max_total=4).preemption
    assert (on.on, on.grace_seconds, on.max_per_run_per_day) == (True, 30, 0)
    assert on.of("interactive").preempts and on.of("schedule").preemptible and not on.of("app").preemptible
    damaged = policy_effective({"preempt_grace_seconds": 0, "classes": {"app": {"preempts": 1}}}, default_max_total=4)
    assert damaged.preemption.grace_seconds == GRACE_DEFAULT and not damaged.preemption.of("app").preempts


def test_cap_zero_never_preempts():
    policy = policy_effective(
        {"max_total": 2, "interactive_reserve": 0, "classes": ON, "max_preemptions_per_run_per_day": 0},
        default_max_total=2,
    )
    assert choose(snap(policy, FULL, {"interactive": [waiting(9)]}), NOW, {}) == []


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"preempt_grace_seconds": 0}, "preempt_grace_seconds"),
        ({"preempt_grace_seconds": 3601}, "preempt_grace_seconds"),
        ({"preempt_grace_seconds": True}, "preempt_grace_seconds"),
        ({"preempt_grace_seconds": "60"}, "preempt_grace_seconds"),
        ({"max_preemptions_per_run_per_day": -1}, "max_preemptions_per_run_per_day"),
        ({"max_preemptions_per_run_per_day": 1.5}, "max_preemptions_per_run_per_day"),
        ({"classes": {"schedule": {"preemptible": "yes"}}}, "classes.schedule.preemptible"),
        ({"classes": {"interactive": {"preempts": 1}}}, "classes.interactive.preempts"),
        ({"classes": {"interactive": {"preempt": True}}}, "classes.interactive.preempt"),
    ],
)
def test_bad_values_name_the_field(changes, field):
    with pytest.raises(PolicyError) as caught:
        policy_validate(changes)
    assert caught.value.field == field


def test_merge_keeps_and_resets():
    stored = {"preempt_grace_seconds": 30, "classes": {"schedule": {"preemptible": True, "limit": 2}}}
    policy_validate(changes := {"preempt_grace_seconds": None, "classes": {"schedule": {"preemptible": None}}})
    merged = policy_merge(stored, changes, partial=True)
    assert merged == {"classes": {"schedule": {"limit": 2}}}
    kept = policy_merge(stored, {"max_preemptions_per_run_per_day": 5}, partial=True)
    assert kept["preempt_grace_seconds"] == 30 and kept["max_preemptions_per_run_per_day"] == 5
