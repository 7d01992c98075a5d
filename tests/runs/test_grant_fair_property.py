"""Property tests of fair share and bounded waiting in the pure grant: 10,000 seeded random operations each (the
operations of test_grant_property.Model: submit, cancel, finish, time passing, node loss, settings changes), with
runs of several owners and random usage.

- Options off (random owners and usage, fairness never set): every pass decides exactly what the seed grant
  (tests/runs/grant_seed.py, the oracle) decides, and the seed invariants hold.
- Options on at random (fair share, per-user limits, aging, max wait, half-life, weights): the seed invariants
  (class limits, total, reserve, capacity, reservation) hold at every step; no grant takes an owner past the
  class's `max_running_per_user`; with resources never binding, a grant never leaves an earlier run of the same
  owner and class waiting (FIFO within a user).
"""

from __future__ import annotations

import dataclasses
import random

from runs.slots.grant import Snapshot, plan
from runs.slots.policy import CLASSES
from runs.slots.resources import Res
from tests.runs import grant_seed
from tests.runs.test_grant_property import OPS, Model

OWNERS = (1, 2, 3, 4, 5)


def fair_raw(rng: random.Random) -> dict:
    """Random fairness settings, each option on about half of the time."""
    classes = {}
    for k in CLASSES:
        item: dict = {}
        if rng.random() < 0.5:
            item["fair_share"] = True
        if rng.random() < 0.4:
            item["max_running_per_user"] = rng.randint(1, 3)
        if rng.random() < 0.3:
            item.update(aging_per_hour=rng.randint(1, 60), aging_cap=rng.randint(1, 40))
        if rng.random() < 0.3:
            item["max_wait_seconds"] = rng.choice([60, 600, 3600])
        classes[k] = item
    out: dict = {"classes": classes, "fair_share_half_life_seconds": rng.choice([60, 3600, 86400])}
    if rng.random() < 0.5:
        out["user_weights"] = {str(o): rng.randint(1, 5) for o in OWNERS if rng.random() < 0.5}
    return out


class FairModel(Model):
    def __init__(self, rng: random.Random, *, fair: bool, big: bool = False) -> None:
        super().__init__(rng)
        self.fair = fair
        self.big = big
        self.usage: dict[int, float] = {}
        self.user_limit_skips = 0
        self.differs = 0  # passes where the options changed the seed's decisions
        self.fair_settings: dict = {}

    def capacity(self) -> dict[str, Res]:
        if self.big:  # resources never bind: only class rules and fairness decide
            return {n: Res(10**6, 10**6, 1 << 50) for n in sorted(self.alive)}
        return super().capacity()

    def step(self) -> None:
        before = self.raw
        super().step()
        for k, q in self.waiting.items():  # give new runs an owner
            self.waiting[k] = [w if w.owner else dataclasses.replace(w, owner=self.rng.choice(OWNERS)) for w in q]
        if self.rng.random() < 0.05:
            self.usage = {o: self.rng.choice([0.0, 0.0, 0.1, 1.0, 5.0]) for o in OWNERS}
        if self.fair and (self.raw is not before and self.rng.random() < 0.8):
            self.fair_settings = fair_raw(self.rng)
        if self.fair:
            classes = {
                k: {**self.raw.get("classes", {}).get(k, {}), **v}
                for k, v in self.fair_settings.get("classes", {}).items()
            }
            self.raw = {**self.raw, **self.fair_settings, "classes": classes}

    def snapshot(self, *, window: bool = True) -> Snapshot:
        snap = super().snapshot(window=window)
        waiting = dict(snap.waiting)
        for k, q in self.waiting.items():  # classes ordered per owner: each owner's FIFO prefix, as the loaders fetch
            size = snap.head_window(k) if window else snap.head_budget(k)
            if snap.policy.per_owner(k) and size:
                per: dict[int, int] = {}
                waiting[k] = [w for w in q if (per := {**per, w.owner: per.get(w.owner, 0) + 1})[w.owner] <= size]
        return dataclasses.replace(snap, waiting=waiting, usage=dict(self.usage))

    def grant_and_check(self) -> None:
        snap = self.snapshot()
        result = plan(snap, self.now)
        seed = grant_seed.plan(snap, self.now)
        self.differs += [d.run_id for d in result.decisions] != [d.run_id for d in seed.decisions]
        if not self.fair:
            ours = [(d.run_id, d.run_class, d.placement, d.backfill_until) for d in result.decisions]
            assert ours == [(d.run_id, d.run_class, d.placement, d.backfill_until) for d in seed.decisions]
            assert (result.reserved, result.shadow) == (seed.reserved, seed.shadow)
        policy = snap.policy
        counts = snap.held_by_owner()
        waiting_before = {k: list(q) for k, q in self.waiting.items()}
        for d in result.decisions:
            run = next(w for w in waiting_before[d.run_class] if w.run_id == d.run_id)
            limit = policy.fairness.of(d.run_class).max_running_per_user
            key = (d.run_class, run.owner)
            assert limit is None or counts.get(key, 0) < limit, "a grant passed the per-user limit"
            counts[key] = counts.get(key, 0) + 1
            if self.big:
                granted = {x.run_id for x in result.decisions}
                earlier = [
                    w
                    for w in waiting_before[d.run_class]
                    if w.owner == run.owner and (w.requested_at, w.run_id) < (run.requested_at, run.run_id)
                ]
                assert all(w.run_id in granted for w in earlier), "FIFO within a user broken"
        if any(policy.fairness.of(k).max_running_per_user for k in CLASSES):
            self.user_limit_skips += result.passed_over
        super().grant_and_check()


def run_model(model: FairModel) -> FairModel:
    for _ in range(OPS):
        model.step()
        model.grant_and_check()
    return model


def test_options_off_decide_exactly_as_the_seed():
    model = run_model(FairModel(random.Random(26), fair=False))
    assert model.granted > 1000 and model.backfilled > 10


def test_seed_invariants_hold_with_fairness_on():
    model = run_model(FairModel(random.Random(2026), fair=True))
    assert model.granted > 1000 and model.user_limit_skips > 0 and model.differs > 100


def test_fifo_within_a_user_and_user_limits_without_resource_pressure():
    model = run_model(FairModel(random.Random(7), fair=True, big=True))
    assert model.granted > 1000 and model.differs > 100
