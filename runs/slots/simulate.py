"""The queue played forward in simulated time with the platform's own decision code: what fair share, user
weights, aging, `max_wait_seconds` and team quotas do to who gets slots, measured without waiting hours for real runs
(bench/fairness.py, tests/runs/test_fairness_shares.py).

Every grant is `runs.slots.grant.plan` on a `Snapshot` as the loaders build it, and every owner's usage is
`runs.slots.fairness.dominant_shares` over the runs' granted resources and times, as runs/slots/usage.py feeds it.
What is simulated is only what happens around those calls: runs are submitted at given times and end after
given durations, and a grant pass runs at every submit, every release and every tick, as the platform's
submits, releases and its tick do. Two simplifications, both toward exactness: usage is computed afresh for
every pass (the platform caches it per process for up to `usage.CACHE_SECONDS`), and every waiting run is in
the snapshot (the loaders fetch only the heads a pass can use, which decide the same).

Pure: no Django, no database, no clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from runs.slots.fairness import RESOURCE_WEIGHTS_DEFAULT, dominant_shares
from runs.slots.grant import HeldSlot, Snapshot, WaitingSlot, plan
from runs.slots.policy import CLASSES, Policy
from runs.slots.resources import Res, total

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
FINISH, SUBMIT = 0, 1  # at one instant: releases first, then submits; then one pass


@dataclass(frozen=True)
class Job:
    """A run to submit: when (seconds from the start), whose, which class, how long it runs once granted."""

    at: float
    owner: int
    run_class: str
    duration: float
    demand: tuple[Res, ...] = (Res(cpu=1000),)


@dataclass
class Outcome:
    job: Job
    run_id: int
    granted: float | None = None  # seconds from the start
    finished: float | None = None

    @property
    def waited(self) -> float | None:
        return None if self.granted is None else self.granted - self.job.at


@dataclass
class _State:
    waiting: dict[str, list[WaitingSlot]] = field(default_factory=lambda: {k: [] for k in CLASSES})
    running: dict[int, HeldSlot] = field(default_factory=dict)


def simulate(
    policy: Policy,
    capacity: Mapping[str, Res],
    jobs: Sequence[Job],
    *,
    tick_s: float = 2.0,
    until_s: float | None = None,
    resource_weights: Mapping[str, float] = RESOURCE_WEIGHTS_DEFAULT,
    groups: Mapping[int, tuple[str, ...]] | None = None,
) -> list[Outcome]:
    """Each job's grant and finish (None: not granted, or not finished, by the end). The simulation ends when
    every job has finished, or at `until_s`. `groups`: owner -> its groups, sorted (team quotas)."""
    outcomes = [Outcome(job, run_id=i + 1) for i, job in enumerate(jobs)]
    events: list[tuple[float, int, int]] = [(o.job.at, SUBMIT, o.run_id) for o in outcomes]
    heapq.heapify(events)
    state = _State()
    end = until_s if until_s is not None else float("inf")
    next_tick = 0.0
    while events or state.running or any(state.waiting.values()):
        at = min(events[0][0] if events else float("inf"), next_tick)
        if at > end or at == float("inf"):
            break
        while events and events[0][0] == at:
            _, kind, run_id = heapq.heappop(events)
            outcome = outcomes[run_id - 1]
            if kind == FINISH:
                outcome.finished = at
                del state.running[run_id]
            else:
                slot = WaitingSlot(run_id, _when(at), outcome.job.demand, "PACK", None, outcome.job.owner)
                state.waiting[outcome.job.run_class].append(slot)
        if at >= next_tick:
            next_tick = at + tick_s
        _grant_pass(policy, capacity, state, outcomes, at, events, resource_weights, groups or {})
        if not events and not state.running:
            break  # nothing left that could free a slot: what still waits never fits
    return outcomes


def _grant_pass(
    policy: Policy,
    capacity: Mapping[str, Res],
    state: _State,
    outcomes: list[Outcome],
    at: float,
    events: list[tuple[float, int, int]],
    resource_weights: Mapping[str, float],
    groups: Mapping[int, tuple[str, ...]],
) -> None:
    now = _when(at)
    running = tuple(sorted(state.running.values(), key=lambda h: h.run_id))
    held = {k: sum(h.run_class == k for h in running) for k in CLASSES}
    usage = _usage(policy, capacity, outcomes, now, resource_weights)
    waiting = {k: list(v) for k, v in state.waiting.items()}
    snapshot = Snapshot(policy, held, waiting, dict(capacity), running, usage, groups)
    for decision in plan(snapshot, now).decisions:
        outcome = outcomes[decision.run_id - 1]
        job = outcome.job
        outcome.granted = at
        queue = state.waiting[decision.run_class]
        queue[:] = [w for w in queue if w.run_id != decision.run_id]
        state.running[decision.run_id] = HeldSlot(
            decision.run_id, decision.run_class, now, None, job.demand, decision.placement, job.owner
        )
        heapq.heappush(events, (at + job.duration, FINISH, decision.run_id))


def _usage(
    policy: Policy,
    capacity: Mapping[str, Res],
    outcomes: list[Outcome],
    now: datetime,
    resource_weights: Mapping[str, float],
) -> dict[int, float]:
    """As runs/slots/usage.py: nothing when no class has fair share on, else every granted run's span."""
    if not any(policy.fairness.of(k).fair_share for k in CLASSES):
        return {}
    spans = [
        (o.job.owner, _when(o.granted), None if o.finished is None else _when(o.finished), total(list(o.job.demand)))
        for o in outcomes
        if o.granted is not None
    ]
    return dominant_shares(
        spans,
        now=now,
        fairness=policy.fairness,
        capacity=total(list(capacity.values())),
        resource_weights=resource_weights,
    )


def _when(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


def shares(outcomes: Sequence[Outcome], *, start: float, end: float) -> dict[int, float]:
    """Each owner's fraction of the grants made in [start, end]."""
    granted = [o.job.owner for o in outcomes if o.granted is not None and start <= o.granted <= end]
    return {owner: granted.count(owner) / len(granted) for owner in sorted(set(granted))} if granted else {}


def contention_window(outcomes: Sequence[Outcome], owners: Sequence[int]) -> tuple[float, float]:
    """From the time every owner has submitted until the first time one of them has nothing left waiting (its
    last grant): the span in which the owners compete for slots."""
    start = max(min(o.job.at for o in outcomes if o.job.owner == owner) for owner in owners)
    never = float("inf")  # an owner with a run never granted competes to the end
    end = min(
        max(never if o.granted is None else o.granted for o in outcomes if o.job.owner == owner) for owner in owners
    )
    return start, end
