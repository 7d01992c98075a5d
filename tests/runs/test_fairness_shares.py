"""Issue 26's fair-share and bounded-waiting acceptance, on bench/fairness.py's scenarios: the platform's own grant
and usage code played forward in simulated time (runs/slots/simulate.py). The same numbers go to
bench/results/fairness.json; here each trial is held to the bound."""

from __future__ import annotations

import pytest

from bench import fairness
from runs.slots.policy import policy_effective
from runs.slots.resources import Res
from runs.slots.simulate import Job, contention_window, shares, simulate

SEEDS = range(5)


@pytest.mark.parametrize("seed", SEEDS)
def test_two_users_split_a_class_evenly_and_two_to_one_by_weight(seed):
    equal = fairness.fair_share(weights=None, on=True, seed=seed, runs=40)
    assert 0.4 <= equal["a"] <= 0.6 and 0.4 <= equal["b"] <= 0.6, equal
    weighted = fairness.fair_share(weights={str(fairness.A): 2}, on=True, seed=seed, runs=40)
    assert 0.57 <= weighted["a"] <= 0.77, weighted


def test_without_fair_share_the_head_start_takes_the_class():
    """The contrast that shows the measure can fail: FIFO gives A every grant while both wait."""
    off = fairness.fair_share(weights=None, on=False, seed=0, runs=40)
    assert off["a"] == 1.0, off


def test_a_low_priority_run_is_granted_within_max_wait_plus_one_tick_while_the_slots_stay_full():
    case = fairness.waiting({"max_wait_seconds": 60}, stream_s=400.0)
    assert case["waited_s"] <= 60 + fairness.TICK_S and case["app_runs_waiting_then"] > 0, case
    starved = fairness.waiting({}, stream_s=400.0)
    assert starved["waited_s"] > 400 - 30, starved  # without it, the stream goes first to its end


def test_aging_grants_it_once_its_effective_priority_reaches_the_stream():
    """10 + 100 points an hour reaches 40 after 1,080 s; at a tie the older request goes first, so the next pass
    (a release or the tick) grants it."""
    case = fairness.waiting({"aging_per_hour": 100, "aging_cap": 40}, stream_s=1300.0)
    assert 1080 <= case["waited_s"] <= 1080 + fairness.TICK_S and case["app_runs_waiting_then"] > 0, case


def test_the_simulation_keeps_the_class_limit_and_grants_every_run():
    policy = policy_effective({"max_total": 3, "interactive_reserve": 0}, default_max_total=3)
    jobs = [Job(i * 0.1, 1 + i % 3, "app", 1.0 + i % 4) for i in range(30)]
    outcomes = simulate(policy, {"n": Res(cpu=64_000)}, jobs)
    assert all(o.granted is not None and o.finished == o.granted + o.job.duration for o in outcomes)
    edges = sorted([(o.granted, 1) for o in outcomes] + [(o.finished, -1) for o in outcomes])
    held = 0
    for _, step in edges:  # a release at the same instant as a grant comes first
        held += step
        assert held <= 3
    start, end = contention_window(outcomes, [1, 2, 3])
    assert sum(shares(outcomes, start=start, end=end).values()) == pytest.approx(1.0)


def test_a_team_that_borrowed_every_slot_gives_them_back_as_its_runs_end():
    """Two teams of quota 2 + 2 in a 4-slot class: red borrows all four while blue is idle; blue arrives at t=30
    and gets the slots freed by red's first two ends (60 s and 70 s); without quotas it waits behind all of red."""
    case = fairness.teams(quotas=True)
    assert case["b_granted_s"][:2] == case["a_first_ends_s"][:2] == [60.0, 70.0], case
    assert fairness.teams(quotas=False)["b_granted_s"][0] > 90.0
