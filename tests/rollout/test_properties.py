"""Property tests: scheduler prefetch bound and exactly-once delivery; channel weights and ordering."""

import concurrent.futures as cf
import itertools
import random
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout.channel.state import ChannelState
from rollout.errors import NoWorkerLeftError
from rollout.filters import FilterVerdict
from rollout.scheduler import RolloutScheduler
from rollout.scheduler_core import SchedulerCore
from rollout.types import GroupResult
from tests.rollout.fakes import CountingSource

KEEP, DROP = FilterVerdict(True), FilterVerdict(False, "zero_variance")

events = st.lists(
    st.tuples(st.sampled_from(["batch", "dispatch", "complete", "fail", "retire", "collect"]), st.integers(0, 1_000)),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(
    capacities=st.lists(st.integers(0, 4), min_size=1, max_size=4).filter(lambda c: sum(c) > 0),
    batch_size=st.integers(1, 5),
    script=events,
)
def test_core_prefetch_bound_and_exactly_once(capacities, batch_size, script):
    core = SchedulerCore(capacities, batch_size)
    ids = itertools.count()
    dispatches: Counter = Counter()
    returned: Counter = Counter()
    delivered: list[int] = []
    dropped: list[int] = []
    backlog: list[int] = []
    tokens = itertools.count()
    prefetch = 0
    alive = True
    for action, n in script:
        if not alive:
            break
        if action == "batch" and not core.demand and not core.collecting:
            prefetch = n % 6
            core.start_batch(prefetch)
        elif action == "dispatch":
            before = len(core.pending) + len(core.ready)
            slots = core.dispatch_slots()
            for worker in slots:
                group = backlog.pop(0) if backlog else next(ids)
                dispatches[group] += 1
                core.register(next(tokens), worker, group)
            if slots:
                # Dispatch never pushes pending + ready beyond demand + prefetch.
                assert len(core.pending) + len(core.ready) <= core.demand + core.prefetch
                assert len(core.pending) + len(core.ready) > before
            assert all(f <= c for f, c in zip(core.in_flight, capacities))  # capacity per worker
        elif action == "complete" and core.pending:
            token = list(core.pending)[n % len(core.pending)]
            group = core.pending[token][2]
            kind = n % 3
            result = GroupResult(rewards=[0.0, 1.0], group_id=group, aborted=(kind == 2))
            core.complete(token, result, DROP if kind == 1 else KEEP)
            if kind == 1:
                dropped.append(group)
        elif action == "fail" and core.pending:
            core.fail(list(core.pending)[n % len(core.pending)])
        elif action == "retire":
            worker = n % len(capacities)
            try:
                for token in core.retire(worker):
                    core.fail(token)
            except NoWorkerLeftError:
                alive = False
        elif action == "collect" and core.demand:
            if core.collect():
                groups, _, _ = core.finish_batch()
                assert len(groups) == batch_size
                delivered.extend(g.group_id for g in groups)
        for group in core.take_returns():
            returned[group] += 1
            backlog.append(group)
        assert all(0 <= f for f in core.in_flight)
    # Exactly once: every dispatch of a group ends in one place.
    in_core = Counter(g for _, _, g in core.pending.values())
    in_core.update(g for _, _, g in core.ready)
    in_core.update(g for _, _, g in core.collecting)
    final = Counter(delivered) + Counter(dropped) + returned + in_core
    assert final == dispatches
    assert len(delivered) == len(set(delivered))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    capacities=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    batch_size=st.integers(1, 4),
    prefetch=st.integers(0, 4),
    batches=st.integers(1, 3),
)
def test_threaded_scheduler_delivers_each_group_once(seed, capacities, batch_size, prefetch, batches):
    rng = random.Random(seed)
    pool = cf.ThreadPoolExecutor(4)
    outcomes = {}

    class Worker:
        def generate_group(self, group, batch_id):
            kind = outcomes.setdefault(
                (group, len([k for k in outcomes if k[0] == group])), rng.choice(["keep", "keep", "drop", "abort"])
            )
            delay = rng.random() * 0.003

            def work():
                import time

                time.sleep(delay)
                if kind == "abort":
                    return GroupResult(rewards=[], aborted=True, group_id=group)
                return GroupResult(rewards=[1.0, 1.0] if kind == "drop" else [0.0, 1.0], group_id=group)

            return pool.submit(work)

    source = CountingSource()
    from rollout.filters import ZeroVarianceFilter

    s = RolloutScheduler([Worker() for _ in capacities], capacities, source, batch_size, filters=[ZeroVarianceFilter()])
    delivered = []
    dropped = 0
    for b in range(batches):
        batch = s.generate(b, prefetch=prefetch)
        assert len(batch.groups) == batch_size
        delivered += [g.group_id for g in batch.groups]
        dropped += sum(batch.dropped.values())
        stats = s.stats()
        assert stats["pending"] + stats["ready"] <= stats["prefetch"]
    s.pause(drain=True)
    ready = [r.group_id for _, r, _ in s.state_dict()["ready"]]
    dropped_total = s.stats().get("dropped", 0)  # includes drops among prefetched groups after the last batch
    assert dropped_total >= dropped
    s.close()
    pool.shutdown()
    assert len(delivered) == len(set(delivered))
    assert set(ready) <= set(source.returned)  # ready results still undelivered at close go back to the source
    # Every hand-out is delivered, dropped by a filter, or returned to the source (aborted, or at close).
    assert source.handed_out == len(delivered) + dropped_total + len(source.returned)
    assert not set(delivered) & set(source.backlog)


weights = st.lists(st.tuples(st.integers(0, 100), st.integers(0, 10)), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(items=weights, target=st.integers(1, 30), max_items=st.one_of(st.none(), st.integers(1, 10)))
def test_channel_get_batch_weights_and_fifo(items, target, max_items):
    state = ChannelState("p")
    with state.cond:
        state.try_enqueue_locked([("default", (i, v), float(w)) for i, (v, w) in enumerate(items)])
    out = []
    while True:
        with state.cond:
            got = state.try_take_locked("default", float(target), max_items or 1 << 30)
        if not got:
            assert len(out) == len(items), "an empty batch while items remain"
            break
        total = sum(items[i][1] for i, _ in got)
        first_weight = items[got[0][0]][1]
        assert total <= target or len(got) == 1 and first_weight > target
        if max_items:
            assert len(got) <= max_items
        # Maximal: the next item would not have fit.
        remaining = len(items) - len(out) - len(got)
        if remaining and (max_items is None or len(got) < max_items):
            assert total + items[got[-1][0] + 1][1] > target
        out.extend(got)
    assert [i for i, _ in out] == list(range(len(items)))  # FIFO, nothing lost or duplicated


@settings(max_examples=150, deadline=None)
@given(
    puts=st.lists(st.sampled_from(["k1", "k2"]), min_size=1, max_size=40),
    takes=st.lists(st.tuples(st.sampled_from(["k1", "k2"]), st.integers(1, 5)), max_size=80),
)
def test_channel_keys_are_independent_fifos_exactly_once(puts, takes):
    state = ChannelState("keys")
    with state.cond:
        state.try_enqueue_locked([(key, (key, i), 0.0) for i, key in enumerate(puts)])
    seen: dict[str, list] = {"k1": [], "k2": []}
    for key, n in [*takes, ("k1", 1 << 20), ("k2", 1 << 20)]:  # then drain what is left
        with state.cond:
            got = state.try_take_locked(key, None, n)
        assert got is None or all(k == key for k, _ in got)
        seen[key].extend(got or [])
    for key, items in seen.items():  # each key: its own items, in put order, each once
        assert items == [(k, i) for i, k in enumerate(puts) if k == key]
    assert state.qsize("k1") == state.qsize("k2") == 0
