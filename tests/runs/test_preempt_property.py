"""Property tests of preemption in the pure grant (runs/slots/preempt.py beside runs/slots/grant.py), driven by
hypothesis: 50 examples of 200 operations each per test (10,000 operations per test): submit, finish, time passing,
checkpoints, settings changes, preemptions completing (the victim back in its queue with its request time); after
each, a grant pass and a preemption pass on the model's snapshot.

- Options off (preemption settings present, no class both preempting and preemptible, random grace and cap):
  no victim is ever chosen and every pass decides exactly what the seed grant decides (tests/runs/grant_seed.py).
- Options on at random: the seed invariants hold for every grant (class limits, total, reserve); a victim is
  always of a preemptible class of strictly lower class priority than the run it makes room for, of a preempting
  class; never a run already being preempted; and no run is preempted more often than the cap in any 24 hours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runs.slots.grant import HeldSlot, Snapshot, WaitingSlot, plan
from runs.slots.policy import CLASSES, policy_effective
from runs.slots.preempt import HeldState, choose
from runs.slots.resources import Res
from tests.runs import grant_seed

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GIB = 1 << 30
NODES = {"n0": Res(4000, 0, 16 * GIB), "n1": Res(4000, 0, 16 * GIB)}
OPS_PER_EXAMPLE, EXAMPLES = 200, 50
OP = st.tuples(
    st.sampled_from(("submit", "submit", "finish", "time", "checkpoint", "settings", "done")), st.integers(0, 10**6)
)


@dataclass
class Model:
    preempting: bool
    now: datetime = T0
    raw: dict = field(default_factory=lambda: {"max_total": 4})
    held: dict[int, HeldSlot] = field(default_factory=dict)
    waiting: dict[str, list[WaitingSlot]] = field(default_factory=lambda: {k: [] for k in CLASSES})
    requested: dict[int, datetime] = field(default_factory=dict)
    checkpoints: dict[int, datetime] = field(default_factory=dict)
    log: dict[int, list[datetime]] = field(default_factory=dict)  # each run's preemption times
    in_flight: dict[int, int] = field(default_factory=dict)  # victim -> the waiting run it makes room for
    next_id: int = 1
    victims: int = 0
    granted: int = 0

    def policy(self):
        return policy_effective(self.raw, default_max_total=4)

    def apply(self, op: str, n: int) -> None:
        if op == "submit" and sum(map(len, self.waiting.values())) < 40:
            run_class = CLASSES[n % 4]
            demand = (Res((250, 500, 1000, 2000, 4000)[n // 4 % 5], 0, GIB),)
            self.requested[self.next_id] = self.now
            self.waiting[run_class].append(WaitingSlot(self.next_id, self.now, demand, owner=n % 3))
            self.next_id += 1
        elif op == "finish" and self.held:
            run_id = sorted(self.held)[n % len(self.held)]
            del self.held[run_id]
            self.in_flight.pop(run_id, None)
        elif op == "time":
            self.now += timedelta(seconds=(30, 600, 3600, 6 * 3600, 25 * 3600)[n % 5])
        elif op == "checkpoint" and self.held:
            self.checkpoints[sorted(self.held)[n % len(self.held)]] = self.now
        elif op == "done":  # every preemption under way completes: the victim is back in its queue, held nowhere
            for victim in list(self.in_flight):
                h = self.held.pop(victim)
                queue = self.waiting[h.run_class]
                queue.append(WaitingSlot(victim, self.requested[victim], h.demand, owner=h.owner))
                queue.sort(key=lambda w: (w.requested_at, w.run_id))
            self.in_flight.clear()
        elif op == "settings":
            self.raw = self.settings(n)

    def settings(self, n: int) -> dict:
        bits = [(n >> i) & 1 for i in range(24)]
        classes = {}
        for i, k in enumerate(CLASSES):
            item: dict = {"priority": (40, 30, 20, 10, 20, 30)[(n >> (2 * i)) % 6]}
            if self.preempting:
                item.update(preemptible=bool(bits[8 + i]), preempts=bool(bits[12 + i]))
            else:  # never both somewhere: some class may preempt, or some may be preempted, not both
                item.update({("preempts" if bits[20] else "preemptible"): bool(bits[8 + i])})
            classes[k] = item
        return {
            "max_total": 1 + n % 6,
            "interactive_reserve": (n >> 3) % 3,
            "classes": classes,
            "preempt_grace_seconds": 1 + n % 300,
            "max_preemptions_per_run_per_day": (n >> 5) % 4,
        }

    def snapshot(self) -> Snapshot:
        counts = {k: sum(1 for h in self.held.values() if h.run_class == k) for k in CLASSES}
        waiting = {k: list(q) for k, q in self.waiting.items() if q}
        return Snapshot(self.policy(), counts, waiting, dict(NODES), tuple(self.held.values()))

    def recent(self, run_id: int) -> int:
        return sum(1 for t in self.log.get(run_id, ()) if t > self.now - timedelta(days=1))

    def grant_and_preempt(self) -> None:
        snap = self.snapshot()
        policy = snap.policy
        result = plan(snap, self.now)
        if not self.preempting:
            seed = grant_seed.plan(snap, self.now)
            assert [(d.run_id, d.placement) for d in result.decisions] == [
                (d.run_id, d.placement) for d in seed.decisions
            ]
        counts = dict(snap.held)
        for d in result.decisions:  # the seed invariants on every grant
            c = policy.classes[d.run_class]
            assert counts[d.run_class] < c.limit and sum(counts.values()) < policy.max_total
            if d.run_class != "interactive":
                assert sum(n for k, n in counts.items() if k != "interactive") < policy.borrowable
            counts[d.run_class] += 1
            w = next(x for x in self.waiting[d.run_class] if x.run_id == d.run_id)
            self.waiting[d.run_class].remove(w)
            self.held[d.run_id] = HeldSlot(d.run_id, d.run_class, self.now, None, w.demand, d.placement, w.owner)
            self.granted += 1
        states = {r: HeldState(self.checkpoints.get(r), self.recent(r), self.in_flight.get(r)) for r in self.held}
        victims = choose(self.snapshot(), self.now, states)
        if not self.preempting:
            assert victims == []
        rules = policy.preemption
        for v in victims:
            assert policy.classes[v.run_class].priority < policy.classes[v.for_class].priority, "equal or lower"
            assert rules.of(v.run_class).preemptible and rules.of(v.for_class).preempts
            assert v.run_id not in self.in_flight, "chosen twice"
            assert self.recent(v.run_id) < rules.max_per_run_per_day, "past the daily cap"
            self.log.setdefault(v.run_id, []).append(self.now)
            self.in_flight[v.run_id] = v.for_run
            assert self.recent(v.run_id) <= rules.max_per_run_per_day
            self.victims += 1


def run(model: Model, ops: list[tuple[str, int]]) -> Model:
    for op, n in ops:
        model.apply(op, n)
        model.grant_and_preempt()
    return model


OPS = st.lists(OP, min_size=OPS_PER_EXAMPLE, max_size=OPS_PER_EXAMPLE)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
TOTALS: dict[str, int] = {"victims": 0, "granted": 0}


@SETTINGS
@given(ops=OPS)
def test_options_off_never_preempt_and_decide_as_the_seed(ops):
    run(Model(preempting=False), ops)


@SETTINGS
@given(ops=OPS)
def test_preemption_keeps_priority_cap_and_seed_invariants(ops):
    model = run(Model(preempting=True), ops)
    TOTALS["victims"] += model.victims
    TOTALS["granted"] += model.granted


def test_the_property_run_preempted_and_granted():
    """The random operations above exercised what they claim (run after them: pytest keeps file order)."""
    if TOTALS["granted"] == 0:
        test_preemption_keeps_priority_cap_and_seed_invariants()
    assert TOTALS["victims"] > 100 and TOTALS["granted"] > 1000, TOTALS
