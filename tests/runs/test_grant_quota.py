"""Table-driven tests of team quotas (runs/slots/quota.py, runs/slots/grant.py): under-quota teams served first,
borrowing while others are idle, no borrowing when it is off or bounded, the remainder team, and the settings'
validation, merge and cross-field rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runs.slots.grant import HeldSlot, Snapshot, WaitingSlot, plan
from runs.slots.policy import CLASSES, PolicyError, policy_check_merged, policy_effective, policy_merge, policy_validate
from runs.slots.quota import ClassQuotas, TeamLedger, TeamQuotas, quotas_effective
from runs.slots.resources import Res

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
BIG = {"n1": Res(cpu=10**6, gpu=10**6, memory=1 << 50)}
RED, BLUE, GREEN, NONE = 1, 2, 3, 4  # owners: in red, in blue, in green and blue, in no team
GROUPS = {RED: ("red",), BLUE: ("blue",), GREEN: ("blue", "green"), NONE: ()}


def pol(limit: int = 4, **app: object):
    classes = {"app": {"limit": limit, **app}}
    return policy_effective({"max_total": 8, "interactive_reserve": 0, "classes": classes}, default_max_total=8)


def w(run_id: int, owner: int, at: int = 0) -> WaitingSlot:
    return WaitingSlot(run_id=run_id, requested_at=T0 + timedelta(seconds=at + run_id), owner=owner)


def h(run_id: int, owner: int, run_class: str = "app") -> HeldSlot:
    return HeldSlot(run_id, run_class, T0, None, (), ("n1",), owner)


def granted(policy, waiting: list[WaitingSlot], held=(), groups=GROUPS) -> tuple[list[int], int]:
    counts = {k: sum(1 for x in held if x.run_class == k) for k in CLASSES}
    result = plan(Snapshot(policy, counts, {"app": waiting}, BIG, tuple(held), groups=groups), NOW)
    return [d.run_id for d in result.decisions], result.passed_over


QUOTAS = {"red": 2, "blue": 2}
CASES = [
    # name, policy, waiting (FIFO), held, expected grants in order
    ("no quotas: FIFO", pol(2), [w(1, RED), w(2, RED), w(3, BLUE)], (), [1, 2]),
    (
        "under quota first: blue (0 of 2) before red's borrowing run, though red asked first",
        pol(4, team_quotas=QUOTAS),
        [w(1, RED), w(2, BLUE)],
        (h(10, RED), h(11, RED), h(12, BLUE)),
        [2],
    ),
    (
        "borrowing when the other team is idle: red takes all four",
        pol(4, team_quotas=QUOTAS),
        [w(1, RED), w(2, RED), w(3, RED), w(4, RED), w(5, RED)],
        (),
        [1, 2, 3, 4],
    ),
    (
        "the pass serves both under-quota teams first, then the borrower",
        pol(4, team_quotas=QUOTAS),
        [w(1, RED), w(2, RED), w(3, RED), w(4, BLUE)],
        (),
        [1, 2, 4, 3],
    ),
    (
        "no borrowing (limit 0): red stops at its quota, the slot stays idle",
        pol(4, team_quotas=QUOTAS, team_borrowing_limit=0),
        [w(1, RED), w(2, RED), w(3, RED)],
        (),
        [1, 2],
    ),
    (
        "borrowing bounded at 1 above the quota",
        pol(4, team_quotas=QUOTAS, team_borrowing_limit=1),
        [w(1, RED), w(2, RED), w(3, RED), w(4, RED)],
        (),
        [1, 2, 3],
    ),
    (
        "several teams: the first group by name with a quota (blue), not green",
        pol(4, team_quotas={"blue": 1, "green": 3}, team_borrowing_limit=0),
        [w(1, GREEN), w(2, GREEN)],
        (),
        [1],
    ),
    (
        "no team: the remainder team's quota is the limit minus the sum (4 - 3 = 1)",
        pol(4, team_quotas={"red": 3}, team_borrowing_limit=0),
        [w(1, NONE), w(2, NONE), w(3, RED)],
        (),
        [1, 3],
    ),
    (
        "a borrowed slot is not preempted: red holds 4, blue waits for the class limit",
        pol(4, team_quotas=QUOTAS),
        [w(1, BLUE)],
        (h(10, RED), h(11, RED), h(12, RED), h(13, RED)),
        [],
    ),
    (
        "a held-back team does not block another team behind it",
        pol(4, team_quotas=QUOTAS, team_borrowing_limit=0),
        [w(1, RED), w(2, BLUE)],
        (h(10, RED), h(11, RED)),
        [2],
    ),
    (
        "quotas are per class: red's app runs do not count in schedule",
        pol(4, team_quotas=QUOTAS, team_borrowing_limit=0),
        [w(1, RED)],
        (h(10, RED, "schedule"), h(11, RED, "schedule")),
        [1],
    ),
]


@pytest.mark.parametrize("name,policy,waiting,held,expected", CASES, ids=[c[0] for c in CASES])
def test_team_quota_rules(name, policy, waiting, held, expected):
    assert granted(policy, waiting, held)[0] == expected


def test_quota_never_exceeded_without_borrowing_and_held_back_runs_count_as_passed_over():
    policy = pol(6, team_quotas={"red": 2, "blue": 2}, team_borrowing_limit=0)
    ids, passed_over = granted(policy, [w(i, RED) for i in range(1, 6)])
    assert ids == [1, 2] and passed_over == 3


def test_with_fair_share_the_class_order_holds_within_each_part():
    policy = pol(4, team_quotas={"red": 1, "blue": 3}, fair_share=True)
    counts = {k: 0 for k in CLASSES}
    waiting = {"app": [w(1, RED), w(2, RED), w(3, BLUE), w(4, GREEN)]}
    snap = Snapshot(policy, counts, waiting, BIG, (), {GREEN: 5.0, BLUE: 1.0}, GROUPS)
    # Under quota: red's first (usage 0), blue's (1.0), green's (5.0, team blue); then red's borrowing run.
    assert [d.run_id for d in plan(snap, NOW).decisions] == [1, 3, 4, 2]


def test_ledger_standing_and_factor():
    policy = pol(4, team_quotas=QUOTAS, team_borrowing_limit=1)
    ledger = TeamLedger(policy.quotas, policy.limits, (h(1, RED), h(2, RED)), GROUPS)
    assert ledger.factor("app", RED) == {
        "enabled": True,
        "team": "red",
        "quota": 2,
        "held": 2,
        "borrowing_limit": 1,
        "state": "borrowing",
    }
    ledger.take("app", RED)
    assert ledger.factor("app", RED)["state"] == "quota_reached"
    remainder = {"enabled": True, "team": None, "quota": 0, "held": 0, "borrowing_limit": 1, "state": "borrowing"}
    assert ledger.factor("app", NONE) == remainder
    assert ledger.factor("schedule", RED)["enabled"] is False


def test_effective_quotas_leave_out_damaged_entries():
    raw = {"classes": {"app": {"team_quotas": {"red": 2, "": 1, "blue": -1, "x": True}, "team_borrowing_limit": "9"}}}
    assert quotas_effective(raw, CLASSES) == TeamQuotas({"app": ClassQuotas({"red": 2}, None)})
    assert quotas_effective({"classes": {"app": {"team_quotas": {"blue": "2"}}}}, CLASSES) == TeamQuotas()
    assert policy_effective({}, default_max_total=4).quotas == TeamQuotas()


@pytest.mark.parametrize(
    "classes,field",
    [
        ({"app": {"team_quotas": [1]}}, "classes.app.team_quotas"),
        ({"app": {"team_quotas": {"red": 1001}}}, "classes.app.team_quotas"),
        ({"app": {"team_quotas": {"red": True}}}, "classes.app.team_quotas"),
        ({"app": {"team_quotas": {" ": 1}}}, "classes.app.team_quotas"),
        ({"app": {"team_quotas": {"x" * 151: 1}}}, "classes.app.team_quotas"),
        ({"app": {"team_quotas": {f"g{i}": 0 for i in range(101)}}}, "classes.app.team_quotas"),
        ({"app": {"team_borrowing_limit": -1}}, "classes.app.team_borrowing_limit"),
        ({"app": {"team_borrowing_limit": 1.5}}, "classes.app.team_borrowing_limit"),
    ],
)
def test_bad_quota_settings_name_the_field(classes, field):
    with pytest.raises(PolicyError) as caught:
        policy_validate({"classes": classes})
    assert caught.value.field == field


def test_quotas_may_not_add_up_past_the_class_limit_and_null_turns_them_off():
    changes = {"max_total": 4, "classes": {"app": {"limit": 3, "team_quotas": {"red": 2, "blue": 2}}}}
    policy_validate(changes)
    raw = policy_merge({}, changes, partial=False)
    with pytest.raises(PolicyError) as caught:
        policy_check_merged(raw, default_max_total=4, changes=changes)
    assert caught.value.field == "classes.app.team_quotas" and "4, more than the class limit 3" in caught.value.message
    fine = policy_merge(raw, {"classes": {"app": {"team_quotas": {"red": 2, "blue": 1}}}}, partial=True)
    policy_check_merged(fine, default_max_total=4, changes={})
    assert fine["classes"]["app"]["team_quotas"] == {"red": 2, "blue": 1}  # replaced whole, not merged
    off = policy_merge(fine, {"classes": {"app": {"team_quotas": None}}}, partial=True)
    assert "team_quotas" not in off["classes"]["app"]
    assert policy_effective(off, default_max_total=4).quotas == TeamQuotas()
