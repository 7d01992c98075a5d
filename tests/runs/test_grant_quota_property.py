"""Property tests of team quotas in the pure grant: 10,000 seeded random operations each (test_grant_property's
submit, cancel, finish, time passing, node loss and settings changes, with test_grant_fair_property's owners and
fairness options), the owners in random teams (Django groups: none, one or two).

- No `team_quotas` (fairness options on at random, groups set): every pass decides exactly what the grant before
  team quotas decided (tests/runs/grant_fair_seed.py, the oracle): same grants, placements, reservation and
  passed-over count.
- Quotas on at random (random teams, quotas summing to at most the class limit, borrowing unbounded, bounded or
  off): the seed invariants hold at every step (class limits, total, reserve, capacity, reservation, heads-only
  equal to full-window decisions); a grant that takes a team to or past its quota is allowed to borrow (never
  past quota + borrowing limit, so never past the quota when borrowing is off); with resources never binding, no
  borrowing grant is made while a run of a team under its quota (not held back by its owner's limit) waits in
  the class.
"""

from __future__ import annotations

import dataclasses
import random

from runs.slots.grant import plan
from runs.slots.policy import CLASSES
from runs.slots.quota import TeamLedger
from tests.runs import grant_fair_seed
from tests.runs.test_grant_fair_property import OWNERS, FairModel

# 10,000 operations as in the other grant property tests (issue 26's acceptance). Each step plans four times (this
# model, the fair model, the seed model, heads only) and the oracle once, so the third test, a variant of the
# second without resource pressure, takes 4,000.
OPS = 10_000
OPS_VARIANT = 4_000

TEAMS = ("blue", "green", "red")
GROUPS = {1: ("red",), 2: ("blue", "red"), 3: ("blue",), 4: ("green",), 5: ()}


def fields(result) -> tuple:
    """A plan's values (the oracle's Plan and Decision are classes of their own)."""
    decisions = [dataclasses.astuple(d) for d in result.decisions]
    return decisions, result.reserved, result.shadow, result.passed_over


class QuotaModel(FairModel):
    def __init__(self, rng: random.Random, *, quotas: bool, fair: bool = True, big: bool = False) -> None:
        super().__init__(rng, fair=fair, big=big)
        self.quotas = quotas
        self.quota_settings: dict[str, dict] = {}
        self.borrowed = 0  # grants that took a team past its quota
        self.held_back = 0  # passes that left a run queued for its team's quota
        self.same = 0

    def step(self) -> None:
        before = self.raw
        super().step()
        if self.quotas and (self.raw is not before or not self.quota_settings):
            limits = self.policy().limits
            self.quota_settings = {}
            for k in CLASSES:
                if self.rng.random() < 0.6:
                    teams = [t for t in TEAMS if self.rng.random() < 0.7]
                    left = limits[k]
                    quotas = {}
                    for t in teams:
                        quotas[t] = self.rng.randint(0, max(0, left))
                        left -= quotas[t]
                    borrow = self.rng.choice([None, None, 0, 1, 2])
                    item = {"team_quotas": quotas} if quotas else {}
                    if borrow is not None and quotas:
                        item["team_borrowing_limit"] = borrow
                    self.quota_settings[k] = item
        if self.quotas:
            classes = dict(self.raw.get("classes", {}))
            for k, item in self.quota_settings.items():
                classes[k] = {**{n: v for n, v in classes.get(k, {}).items() if not n.startswith("team_")}, **item}
            self.raw = {**self.raw, "classes": classes}

    def snapshot(self, *, window: bool = True):
        return dataclasses.replace(super().snapshot(window=window), groups={o: g for o, g in GROUPS.items() if g})

    def grant_and_check(self) -> None:
        snap = self.snapshot()
        result = plan(snap, self.now)
        if not self.quotas:
            oracle = grant_fair_seed.plan(snap, self.now)
            assert fields(result) == fields(oracle), "without team quotas the grant decided differently"
            self.same += 1
        policy = snap.policy
        assert all(sum(c.quotas.values()) <= policy.classes[k].limit for k, c in policy.quotas.classes.items())
        ledger = TeamLedger(policy.quotas, policy.limits, snap.running, snap.groups)
        by_owner = snap.held_by_owner()
        runs = {w.run_id: (k, w) for k, q in snap.waiting.items() for w in q}
        taken: set[int] = set()
        for d in result.decisions:
            run_class, run = runs[d.run_id]
            quotas, team = policy.quotas.of(run_class), ledger.team(run_class, run.owner)
            if quotas is not None and team is not None:
                nominal = quotas.nominal(team, policy.classes[run_class].limit)
                held = ledger.held.get((run_class, team), 0)
                if held >= nominal:
                    self.borrowed += 1
                    bound = quotas.borrowing_limit
                    assert bound is not None and bound > 0 or bound is None, "borrowed with borrowing off"
                    assert bound is None or held < nominal + bound, "borrowed past the borrowing limit"
                    if self.big:
                        limit = policy.fairness.of(run_class).max_running_per_user
                        for k, other in ((run_class, x) for x in snap.waiting.get(run_class, [])):
                            if other.run_id in taken or other.run_id == run.run_id:
                                continue
                            mine = by_owner.get((k, other.owner), 0)
                            if limit is not None and mine >= limit:
                                continue  # held back by its owner's limit, not waiting for the slot
                            assert ledger.standing(k, other.owner) != 0, "a borrower went before an under-quota team"
            ledger.take(run_class, run.owner)
            by_owner[(run_class, run.owner)] = by_owner.get((run_class, run.owner), 0) + 1
            taken.add(d.run_id)
        if self.quotas and policy.quotas.classes and result.passed_over:
            self.held_back += 1
        owners = {w.run_id: w.owner for q in self.waiting.values() for w in q}
        super().grant_and_check()
        self.held = {k: h if h.owner else dataclasses.replace(h, owner=owners.get(k, 0)) for k, h in self.held.items()}


def run_model(model: QuotaModel, ops: int = OPS) -> QuotaModel:
    for _ in range(ops):
        model.step()
        model.grant_and_check()
    return model


def test_without_quotas_the_grant_decides_as_before_whatever_the_groups():
    model = run_model(QuotaModel(random.Random(2601), quotas=False))
    assert model.granted > 800 and model.same == OPS and model.differs > 100


def test_seed_invariants_and_quotas_hold_with_quotas_on():
    model = run_model(QuotaModel(random.Random(2602), quotas=True))
    assert model.granted > 800 and model.borrowed > 100 and model.held_back > 100
    assert min(model.heads_only.values()) > 100, model.heads_only


def test_under_quota_teams_go_first_without_resource_pressure():
    model = run_model(QuotaModel(random.Random(2603), quotas=True, big=True), OPS_VARIANT)
    assert model.granted > 800 and model.borrowed > 100, (model.granted, model.borrowed)


assert OWNERS == tuple(sorted(GROUPS))  # every owner the model submits for has a (possibly empty) set of groups
