"""Table-driven tests of fair share and bounded waiting (runs/slots/fairness.py, runs/slots/grant.py): every new
rule with an injected clock, the decayed usage arithmetic, and the settings' validation and merge."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from runs.slots.fairness import Fairness, decayed_seconds, dominant_shares, effective_priority, fairness_effective
from runs.slots.grant import HeldSlot, Snapshot, WaitingSlot, grant
from runs.slots.policy import CLASSES, PolicyError, policy_effective, policy_merge, policy_validate
from runs.slots.resources import Res

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(hours=2)
BIG = {"n1": Res(cpu=10**6, gpu=10**6, memory=1 << 50)}


def pol(max_total: int = 4, **classes: dict) -> object:
    return policy_effective({"max_total": max_total, "interactive_reserve": 0, "classes": classes}, default_max_total=4)


def w(run_id: int, owner: int, at: int) -> WaitingSlot:
    return WaitingSlot(run_id=run_id, requested_at=T0 + timedelta(seconds=at), owner=owner)


def h(run_id: int, run_class: str, owner: int) -> HeldSlot:
    return HeldSlot(run_id, run_class, T0, None, (), ("n1",), owner)


def granted(policy, waiting, *, held=(), usage=None, now=NOW) -> list[int]:
    counts = {k: sum(1 for x in held if x.run_class == k) for k in CLASSES}
    snap = Snapshot(policy, counts, waiting, BIG, tuple(held), usage or {})
    return [d.run_id for d in grant(snap, now)]


APP = {"limit": 4, "priority": 30}
CASES = [
    # name, policy, waiting, held, usage, expected grant order
    ("off: FIFO whatever the usage", pol(2), {"app": [w(1, 1, 0), w(2, 2, 5)]}, (), {1: 9.0}, [1, 2]),
    (
        "fair share: the owner without recent usage goes first",
        pol(1, app={"fair_share": True}),
        {"app": [w(1, 1, 0), w(2, 2, 5)]},
        (),
        {1: 9.0},
        [2],
    ),
    (
        "fair share: FIFO among one owner's runs, lower usage first",
        pol(4, app={"fair_share": True}),
        {"app": [w(1, 1, 0), w(2, 1, 1), w(3, 2, 2), w(4, 2, 3)]},
        (),
        {1: 2.0, 2: 1.0},
        [3, 4, 1, 2],
    ),
    (
        "fair share only within the class: priority across classes unchanged",
        pol(1, app={"fair_share": True}),
        {"app": [w(1, 2, 9)], "interactive": [w(2, 1, 0)]},
        (),
        {1: 9.0},
        [2],
    ),
    (
        "max_running_per_user: the owner at the limit waits, the next owner runs",
        pol(4, app={"max_running_per_user": 1}),
        {"app": [w(1, 1, 0), w(2, 1, 1), w(3, 2, 2)]},
        (h(9, "app", 1),),
        {},
        [3],
    ),
    (
        "max_running_per_user counts grants of the same pass",
        pol(4, app={"max_running_per_user": 2}),
        {"app": [w(1, 1, 0), w(2, 1, 1), w(3, 1, 2), w(4, 2, 3)]},
        (),
        {},
        [1, 2, 4],
    ),
    (
        "max_running_per_user is per class: a held run of another class does not count",
        pol(4, app={"max_running_per_user": 1}),
        {"app": [w(1, 1, 0)]},
        (h(9, "system", 1),),
        {},
        [1],
    ),
    (
        "aging: a system run that waited 2 h at 20/h passes an app run",
        pol(1, system={"aging_per_hour": 20, "aging_cap": 30}),
        {"system": [w(1, 1, 0)], "app": [w(2, 2, 3600)]},
        (),
        {},
        [1],
    ),
    (
        "aging: the cap bounds it (10 + 15 < 30)",
        pol(1, system={"aging_per_hour": 20, "aging_cap": 15}),
        {"system": [w(1, 1, 0)], "app": [w(2, 2, 3600)]},
        (),
        {},
        [2],
    ),
    (
        "max_wait_seconds: an overdue system run goes before interactive",
        pol(1, system={"max_wait_seconds": 3600}),
        {"system": [w(1, 1, 0)], "interactive": [w(2, 2, 0)]},
        (),
        {},
        [1],
    ),
    (
        "max_wait_seconds not yet passed: priority decides",
        pol(1, system={"max_wait_seconds": 3 * 3600}),
        {"system": [w(1, 1, 0)], "interactive": [w(2, 2, 0)]},
        (),
        {},
        [2],
    ),
    (
        "overdue but its class is at its limit: the others still run",
        pol(2, system={"max_wait_seconds": 60, "limit": 1}),
        {"system": [w(1, 1, 0)], "interactive": [w(2, 2, 0)]},
        (h(9, "system", 3),),
        {},
        [2],
    ),
]


@pytest.mark.parametrize(("name", "policy", "waiting", "held", "usage", "expected"), CASES, ids=[c[0] for c in CASES])
def test_fairness_rules(name, policy, waiting, held, usage, expected):
    assert granted(policy, waiting, held=held, usage=usage) == expected


def test_decay_halves_per_half_life_and_integrates_the_interval():
    hour = timedelta(hours=1)
    full = decayed_seconds(NOW - hour, NOW, NOW, 3600)
    assert full == pytest.approx(3600 / (2 * math.log(2)))  # integral of 2^-t/h over one half-life
    assert decayed_seconds(NOW - 2 * hour, NOW - hour, NOW, 3600) == pytest.approx(full / 2)
    assert decayed_seconds(NOW - hour, None, NOW, 3600) == pytest.approx(full)  # still running: up to now
    assert decayed_seconds(NOW, NOW + hour, NOW, 3600) == 0.0  # nothing in the future counts


def test_dominant_share_weights_gpu_and_user_weights():
    cap = Res(cpu=100_000, gpu=10_000, memory=1 << 40)
    fair = Fairness(half_life_seconds=3600, user_weights={2: 4})
    spans = [
        (1, NOW - timedelta(hours=1), None, Res(cpu=10_000, gpu=0, memory=0)),  # 10 % of the CPUs
        (2, NOW - timedelta(hours=1), None, Res(cpu=0, gpu=1_000, memory=0)),  # 10 % of the GPUs, weight 4
        (3, NOW - timedelta(hours=1), None, Res(cpu=0, gpu=1_000, memory=0)),  # 10 % of the GPUs
    ]
    shares = dominant_shares(spans, now=NOW, fairness=fair, capacity=cap, resource_weights={"GPU": 4.0})
    assert shares[3] == pytest.approx(4 * shares[1])  # GPU-seconds weigh 4x CPU-seconds
    assert shares[2] == pytest.approx(shares[1])  # the same GPU use, divided by the owner's weight 4
    assert 4 not in shares


def test_effective_priority_rate_and_cap():
    rules = fairness_effective({"classes": {"app": {"aging_per_hour": 10, "aging_cap": 25}}}, CLASSES).of("app")
    assert effective_priority(30, rules, 3600) == 40 and effective_priority(30, rules, 10 * 3600) == 55
    assert effective_priority(30, fairness_effective({}, CLASSES).of("app"), 10**6) == 30


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"fair_share_half_life_seconds": 0}, "fair_share_half_life_seconds"),
        ({"fair_share_half_life_seconds": "1h"}, "fair_share_half_life_seconds"),
        ({"user_weights": {"alice": 2}}, "user_weights"),
        ({"user_weights": {"3": 0}}, "user_weights"),
        ({"user_weights": [1, 2]}, "user_weights"),
        ({"user_weights": {str(i): 1 for i in range(1001)}}, "user_weights"),
        ({"classes": {"app": {"fair_share": "yes"}}}, "classes.app.fair_share"),
        ({"classes": {"app": {"max_running_per_user": 0}}}, "classes.app.max_running_per_user"),
        ({"classes": {"app": {"aging_per_hour": -1}}}, "classes.app.aging_per_hour"),
        ({"classes": {"app": {"aging_cap": 101}}}, "classes.app.aging_cap"),
        ({"classes": {"app": {"max_wait_seconds": True}}}, "classes.app.max_wait_seconds"),
        ({"classes": {"app": {"fairshare": True}}}, "classes.app.fairshare"),
    ],
)
def test_bad_fairness_settings_name_the_field(changes, field):
    with pytest.raises(PolicyError) as exc:
        policy_validate(changes)
    assert exc.value.field == field


def test_fairness_settings_merge_and_null_turns_off():
    changes = {"fair_share_half_life_seconds": 60, "classes": {"app": {"fair_share": True, "max_wait_seconds": 9}}}
    policy_validate(changes)
    raw = policy_merge({}, changes, partial=True)
    fair = policy_effective(raw, default_max_total=4).fairness
    assert fair.half_life_seconds == 60 and fair.of("app").fair_share and fair.of("app").max_wait_seconds == 9
    off = {"fair_share_half_life_seconds": None, "classes": {"app": {"max_wait_seconds": None}}}
    policy_validate(off)
    raw = policy_merge(raw, off, partial=True)
    fair = policy_effective(raw, default_max_total=4).fairness
    assert fair.half_life_seconds == 3600 and fair.of("app").max_wait_seconds is None and fair.of("app").fair_share
    assert policy_effective({}, default_max_total=4).fairness == Fairness()  # defaults: every option off


def test_queue_order_is_the_seed_order_with_options_off_and_the_grant_order_with_them_on():
    import random

    from runs.slots.order import queue_order

    rng = random.Random(5)
    waiting: dict[str, list[WaitingSlot]] = {k: [] for k in CLASSES}
    for run_id in range(1, 400):
        waiting[rng.choice(CLASSES)].append(w(run_id, rng.randint(1, 6), rng.randint(0, 7200)))
    for q in waiting.values():
        q.sort(key=lambda x: (x.requested_at, x.run_id))
    usage = {o: rng.random() for o in range(1, 7)}
    off = pol(1000)
    seed = sorted(
        ((k, x) for k, q in waiting.items() for x in q),
        key=lambda e: (-off.classes[e[0]].priority, e[1].requested_at, e[1].run_id),
    )
    assert queue_order(off, waiting, usage, NOW) == seed
    rules = {"fair_share": True, "aging_per_hour": 30, "aging_cap": 25, "max_wait_seconds": 6000}
    on = pol(1000, **{k: rules for k in CLASSES})
    order = [x.run_id for _k, x in queue_order(on, waiting, usage, NOW)]
    assert order == granted(on, waiting, usage=usage)  # resources and limits never bind: the grant's order
    assert order != [x.run_id for _k, x in seed]
