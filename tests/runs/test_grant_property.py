"""Property test of the pure grant with resource vectors: 10,000 seeded random operations (submit, cancel,
finish, time passing with time limits, node loss and return, settings changes including gpu_limit), a grant
pass after each, and the invariants checked on every decision:

- granted resources never exceed a node's capacity (every node's held bundles fit it);
- class rules: a grant never takes a class past its limit or gpu_limit, the others past the borrowable slots,
  or all past max_total (lowered limits do not preempt, so only grants are checked);
- no run is partially placed: one alive node per bundle;
- the head's reservation is never delayed: a backfilled run's latest end is not after the shadow time, and the
  head's shadow recomputed after the pass is not later than before it;
- a pass on only the heads a pass could take (loaders' window 0) that passed over no run decides exactly what
  the pass on the full window decides (what lets the PostgreSQL path skip loading the window).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from runs.slots.fit import shadow_time
from runs.slots.grant import BACKFILL_WINDOW, HeldSlot, Snapshot, WaitingSlot, latest_end, plan
from runs.slots.policy import CLASSES, policy_effective
from runs.slots.resources import Res, total

OPS = 10_000
T0 = datetime(2026, 1, 1, tzinfo=UTC)
GIB = 1 << 30
NODES = {"n0": Res(4000, 2000, 16 * GIB), "n1": Res(4000, 2000, 16 * GIB), "n2": Res(8000, 0, 32 * GIB)}


class Model:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.now = T0
        self.alive = set(NODES)
        self.raw: dict = {"max_total": 6}
        self.held: dict[int, HeldSlot] = {}
        self.waiting: dict[str, list[WaitingSlot]] = {k: [] for k in CLASSES}
        self.next_id = 1
        self.granted = 0
        self.backfilled = 0
        self.heads_only = {"same": 0, "window needed": 0}

    def policy(self):
        return policy_effective(self.raw, default_max_total=6)

    def capacity(self) -> dict[str, Res]:
        return {n: NODES[n] for n in sorted(self.alive)}

    def demand(self) -> tuple[Res, ...]:
        rng = self.rng
        bundles = []
        for _ in range(rng.randint(1, 4)):
            gpu = rng.choice([0, 0, 0, 500, 1000, 2000])
            bundles.append(Res(rng.choice([125, 250, 500, 1000, 2000]), gpu, rng.choice([256, 512, 2048]) << 20))
        return tuple(bundles)

    def step(self) -> None:
        rng = self.rng
        op = rng.random()
        queued = sum(len(q) for q in self.waiting.values())
        if op < 0.35 and queued < 80:
            run_class = rng.choice(CLASSES)
            limit = rng.choice([None, 60, 300, 900, 3600, 7200])
            strategy = rng.choice(["PACK", "PACK", "STRICT_PACK", "SPREAD"])
            slot = WaitingSlot(self.next_id, self.now, self.demand(), strategy, limit)
            self.next_id += 1
            self.waiting[run_class].append(slot)
        elif op < 0.45 and queued:
            q = rng.choice([q for q in self.waiting.values() if q])
            q.remove(rng.choice(q))  # cancel a queued run
        elif op < 0.65 and self.held:
            del self.held[rng.choice(sorted(self.held))]  # a run finishes early
        elif op < 0.85:
            self.now += timedelta(seconds=rng.choice([1, 30, 120, 600]))
            for run_id, h in list(self.held.items()):  # time limits end runs at their latest end
                if h.latest_end is not None and h.latest_end <= self.now:
                    del self.held[run_id]
        elif op < 0.92:
            lost = rng.choice(sorted(NODES))
            if lost in self.alive and len(self.alive) > 1 and rng.random() < 0.6:
                self.alive.discard(lost)  # node loss: its runs fail and release everything they held
                self.held = {k: h for k, h in self.held.items() if lost not in h.placement}
            else:
                self.alive.add(lost)
        else:
            self.raw = {
                "max_total": rng.randint(1, 8),
                "interactive_reserve": rng.choice([None, 0, 1, 2]),
                "classes": {
                    k: {
                        **({"limit": rng.randint(1, 8)} if rng.random() < 0.3 else {}),
                        **({"gpu_limit": rng.choice([0, 1, 2, 3])} if rng.random() < 0.3 else {}),
                    }
                    for k in CLASSES
                },
            }
            self.raw = {k: v for k, v in self.raw.items() if v is not None}

    def snapshot(self, *, window: bool = True) -> Snapshot:
        policy = self.policy()
        counts = {k: 0 for k in CLASSES}
        for h in self.held.values():
            counts[h.run_class] += 1
        probe = Snapshot(policy=policy, held=counts)
        size = probe.head_window if window else probe.head_budget
        waiting = {k: q[: size(k)] for k, q in self.waiting.items() if size(k)}
        return Snapshot(policy, counts, waiting, self.capacity(), tuple(self.held.values()))

    def grant_and_check(self) -> None:
        snap = self.snapshot()
        policy, now = snap.policy, self.now
        result = plan(snap, now)
        heads_only = plan(self.snapshot(window=False), now)
        if heads_only.passed_over == 0:
            assert heads_only.decisions == result.decisions, "the heads alone decided differently"
            self.heads_only["same"] += 1
        else:
            self.heads_only["window needed"] += 1
        counts, gpus = dict(snap.held), snap.held_gpus()
        by_id = {w.run_id: (k, w) for k, q in snap.waiting.items() for w in q}
        for d in result.decisions:
            run_class, slot = by_id[d.run_id]
            assert run_class == d.run_class
            assert len(d.placement) == len(slot.demand) and set(d.placement) <= self.alive, "partial placement"
            c = policy.classes[run_class]
            assert counts[run_class] < c.limit and sum(counts.values()) < policy.max_total
            if run_class != "interactive":
                assert sum(n for k, n in counts.items() if k != "interactive") < policy.borrowable
            need = total(slot.demand).gpu
            assert c.gpu_limit is None or need == 0 or gpus[run_class] + need <= c.gpu_limit * 1000
            if d.backfill_until is not None:
                end = latest_end(now, slot.time_limit_seconds)
                assert end is not None and end <= d.backfill_until, "backfill would delay the head"
                self.backfilled += 1
            counts[run_class] += 1
            gpus[run_class] += need
            self.held[d.run_id] = HeldSlot(d.run_id, run_class, now, slot.time_limit_seconds, slot.demand, d.placement)
            self.waiting[run_class].remove(slot)
            self.granted += 1
        for node_id, cap in self.capacity().items():  # never more than a node has
            used = Res()
            for h in self.held.values():
                for bundle, where in zip(h.demand, h.placement):
                    if where == node_id:
                        used = used + bundle
            assert used.fits_in(cap), f"node {node_id} over capacity: {used} > {cap}"
        if result.reserved is not None and result.shadow is not None:
            head = next(w for q in self.waiting.values() for w in q if w.run_id == result.reserved)
            after = Snapshot(policy, counts, {}, self.capacity(), tuple(self.held.values()))
            endings = [(h.latest_end, h.demand, h.placement) for h in after.running]
            again = shadow_time(head.demand, head.strategy, after.free, endings, now)
            assert again is not None and again <= result.shadow, "the pass delayed the reserved head"


def test_grant_invariants_over_random_operations():
    model = Model(random.Random(20261130))
    for _ in range(OPS):
        model.step()
        model.grant_and_check()
    # The run exercised what it claims to: many grants, backfills within reservations.
    assert model.granted > 1000 and model.backfilled > 10
    assert min(model.heads_only.values()) > 100, model.heads_only
    assert BACKFILL_WINDOW > 0
