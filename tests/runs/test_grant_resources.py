"""Table-driven tests of the grant's resource rules: packing onto nodes, gpu_limit, no capacity, the head's
reservation and backfill within it; and the submit-time refusal of a run that can never fit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runs.slots.fit import never_fits
from runs.slots.grant import HeldSlot, Snapshot, WaitingSlot, grant, plan
from runs.slots.policy import policy_effective
from runs.slots.resources import Res

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
GIB = 1 << 30


def gpus(n: float, cpu: float = 0.5) -> Res:
    return Res(cpu=round(cpu * 1000), gpu=round(n * 1000), memory=GIB)


def node(cpu: float, gpu: float = 0, memory: int = 64 * GIB) -> Res:
    return Res(cpu=round(cpu * 1000), gpu=round(gpu * 1000), memory=memory)


TWO_BY_TWO = {"a": node(8, 2), "b": node(8, 2)}  # two nodes of 2 GPUs each


def pol(max_total: int = 16, reserve: int = 0, **classes: dict) -> object:
    return policy_effective(
        {"max_total": max_total, "interactive_reserve": reserve, "classes": classes}, default_max_total=4
    )


def wait(run_id: int, demand: list[Res], at: int = 0, limit: int | None = 3600, strategy: str = "PACK") -> WaitingSlot:
    return WaitingSlot(run_id, T0 + timedelta(seconds=at), tuple(demand), strategy, limit)


def held(run_id: int, demand: list[Res], placement: list[str], ends_in: int, run_class: str = "app") -> HeldSlot:
    """A held run whose latest end is `ends_in` seconds after NOW."""
    return HeldSlot(run_id, run_class, NOW - timedelta(seconds=100), 100 + ends_in, tuple(demand), tuple(placement))


def snap(waiting: dict, running: tuple = (), capacity: dict = TWO_BY_TWO, policy=None) -> Snapshot:
    counts: dict[str, int] = {}
    for h in running:
        counts[h.run_class] = counts.get(h.run_class, 0) + 1
    return Snapshot(policy=policy or pol(), held=counts, waiting=waiting, capacity=capacity, running=tuple(running))


@pytest.mark.parametrize(
    "name,demand,strategy,granted,placement",
    [
        ("1 GPU", [gpus(1)], "PACK", True, ("a",)),
        ("2 GPUs in one bundle", [gpus(2)], "PACK", True, ("a",)),
        ("4 GPUs in bundles of 1 fit across the nodes", [gpus(1)] * 4, "PACK", True, ("a", "a", "b", "b")),
        ("4 GPUs in bundles of 1, STRICT_PACK: one node has only 2", [gpus(1)] * 4, "STRICT_PACK", False, None),
        ("a single 4-GPU bundle never fits", [gpus(4)], "PACK", False, None),
        ("CPU only", [node(1, 0, GIB)] * 3, "PACK", True, ("a", "a", "a")),
    ],
)
def test_gpu_runs_on_two_nodes_of_two(name, demand, strategy, granted, placement):
    decisions = grant(snap({"app": [wait(1, demand, strategy=strategy)]}), NOW)
    assert bool(decisions) == granted
    if granted:
        assert decisions[0].placement == placement


def test_four_gpu_bundle_is_refused_with_the_cluster_total():
    assert (
        never_fits((gpus(4),), "PACK", TWO_BY_TWO)
        == "needs 4 GPU in one bundle; the cluster has 4 GPU (largest node 2)"
    )
    assert never_fits((gpus(1),) * 4, "STRICT_PACK", TWO_BY_TWO).startswith("needs 4 GPU on one node (STRICT_PACK)")
    assert never_fits((gpus(1),) * 5, "PACK", TWO_BY_TWO).startswith("needs 5 GPU in total; the cluster has 4 GPU")
    assert never_fits((gpus(1),) * 4, "PACK", TWO_BY_TWO) is None
    assert never_fits((gpus(4),), "PACK", {}) is None  # capacity unknown: accepted, it waits


def test_runs_are_admitted_only_while_they_fit():
    waiting = {"app": [wait(1, [gpus(2)], 0), wait(2, [gpus(1)], 1), wait(3, [gpus(1)], 2), wait(4, [gpus(1)], 3)]}
    decisions = grant(snap(waiting), NOW)
    assert [d.run_id for d in decisions] == [1, 2, 3]  # 2 + 1 + 1 = the 4 GPUs; run 4 waits
    assert [d.placement for d in decisions] == [("a",), ("b",), ("b",)]


def test_no_capacity_known_grants_nothing():
    assert grant(snap({"app": [wait(1, [])]}, capacity={}), NOW) == []


def test_gpu_limit_skips_the_class_without_blocking_others():
    policy = pol(app={"gpu_limit": 1})
    running = (held(9, [gpus(1)], ["a"], 600),)
    waiting = {"app": [wait(1, [gpus(1)], 0), wait(2, [node(1, 0, GIB)], 1)], "system": [wait(3, [gpus(1)], 2)]}
    decisions = grant(snap(waiting, running, policy=policy), NOW)
    assert [d.run_id for d in decisions] == [3]  # app at its GPU limit is skipped whole (FIFO), system runs


def test_a_gpu_free_run_passes_a_gpu_limit_of_zero():
    decisions = grant(snap({"app": [wait(1, [node(1, 0, GIB)])]}, policy=pol(app={"gpu_limit": 0})), NOW)
    assert [d.run_id for d in decisions] == [1]


def test_head_reserved_backfill_only_within_its_shadow():
    # 3 of 4 GPUs held: one run ends in 10 min, two in 60 min. The head needs all 4 GPUs: shadow = 60 min.
    running = (
        held(10, [gpus(1)], ["a"], 600),
        held(11, [gpus(1)], ["a"], 3600),
        held(12, [gpus(1)], ["b"], 3600),
    )
    waiting = {
        "app": [
            wait(1, [gpus(1)] * 4, 0),
            wait(2, [gpus(1)], 1, limit=7200),  # fits now, but would still run at the shadow time: not started
            wait(3, [gpus(1)], 2, limit=1800),  # fits now and ends before: backfilled
            wait(4, [gpus(1)], 3, limit=60),  # ends before, but nothing is left free
        ]
    }
    result = plan(snap(waiting, running), NOW)
    assert result.reserved == 1 and result.shadow == NOW + timedelta(seconds=3600)
    assert [(d.run_id, d.backfill_until) for d in result.decisions] == [(3, NOW + timedelta(seconds=3600))]


def test_a_run_without_a_time_limit_is_never_backfilled():
    running = (held(10, [gpus(2)], ["a"], 600),)
    waiting = {"app": [wait(1, [gpus(2)] * 2, 0), wait(2, [gpus(1)], 1, limit=None)]}
    assert grant(snap(waiting, running), NOW) == []


def test_unknown_shadow_allows_no_backfill():
    running = (HeldSlot(10, "app", NOW, None, (gpus(2),), ("a",)),)  # no time limit: its end is not known
    waiting = {"app": [wait(1, [gpus(2)] * 2, 0), wait(2, [gpus(1)], 1, limit=1)]}
    result = plan(snap(waiting, running), NOW)
    assert result.reserved == 1 and result.shadow is None and result.decisions == []


def test_head_that_no_longer_fits_the_cluster_is_skipped_not_reserved():
    waiting = {"app": [wait(1, [gpus(2)] * 2, 0), wait(2, [gpus(1)], 1)]}
    result = plan(snap(waiting, capacity={"a": node(8, 2)}), NOW)  # node b lost after run 1 was submitted
    assert result.reserved is None and [d.run_id for d in result.decisions] == [2]


def test_reservation_spans_classes_by_priority():
    running = (held(10, [gpus(2)], ["a"], 600),)
    waiting = {
        "interactive": [wait(1, [gpus(2)] * 2, 5)],  # the head: highest priority
        "system": [wait(2, [gpus(2)], 0, limit=7200), wait(3, [gpus(2)], 1, limit=300)],
    }
    result = plan(snap(waiting, running), NOW)
    assert result.reserved == 1 and [d.run_id for d in result.decisions] == [3]


def test_four_gpu_head_starts_within_one_pass_while_one_gpu_runs_keep_arriving():
    """Simulated time: 1-GPU runs (time limit 20 min) arrive every minute behind a 4-GPU head. Held runs end at
    their latest end. The head starts in the first pass after 4 GPUs are free, and every 1-GPU run granted
    while it waits ends before its shadow time."""
    now = NOW
    running = [held(100 + i, [gpus(1)], ["a", "a", "b", "b"][i : i + 1], 600 * (i + 1)) for i in range(4)]
    waiting = [wait(1, [gpus(1)] * 4, 0)]
    next_id, head_started, shadows, backfilled = 2, None, [], 0
    for minute in range(120):
        now = NOW + timedelta(minutes=minute)
        running = [h for h in running if h.latest_end > now]  # time limits: a held run ends at its latest end
        waiting.append(WaitingSlot(next_id, now, (gpus(1),), "PACK", 1200))
        next_id += 1
        free_gpus = 4000 - sum(b.gpu for h in running for b in h.demand)
        result = plan(snap({"app": list(waiting)}, tuple(running)), now)
        if result.reserved == 1:
            shadows.append(result.shadow)
        for d in result.decisions:
            run = next(w for w in waiting if w.run_id == d.run_id)
            waiting.remove(run)
            if d.run_id == 1:
                head_started = now
                assert free_gpus == 4000  # it started in the very pass where 4 GPUs were free
            else:
                assert d.backfill_until is not None and now + timedelta(seconds=1200) <= d.backfill_until
                backfilled += 1
            running.append(HeldSlot(d.run_id, "app", now, run.time_limit_seconds, run.demand, d.placement))
        if head_started:
            break
    assert head_started is not None and shadows and head_started <= shadows[0]
    assert head_started == NOW + timedelta(minutes=40) and backfilled >= 1
