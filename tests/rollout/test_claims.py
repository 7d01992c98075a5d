"""Results that are receipts (claims=True): workers put groups into a channel, the consumer takes items from it
and the scheduler's ledger says which of them to train; stale ones go back, orphans are dropped, nothing is
delivered twice. The ledger alone (SchedulerCore) and a RolloutScheduler whose workers put into a real channel."""

import concurrent.futures as cf
import itertools
import threading
from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rollout.channel import Channel
from rollout.errors import SchedulerStateError
from rollout.filters import KEEP, FilterVerdict
from rollout.scheduler import RolloutScheduler
from rollout.scheduler_core import SchedulerCore
from rollout.types import GroupResult
from tests.rollout.fakes import CountingSource, wait_until

DROP = FilterVerdict(False, "zero_variance")


def _receipt(group: int, attempt: str = "a") -> GroupResult:
    return GroupResult(rewards=[0.0, 1.0], group_id=group, attempt=attempt)


def _core_with_batch(batch_size: int, prefetch: int, kept: int) -> SchedulerCore:
    """A claims ledger after one finished batch, with `kept` results completed in group order."""
    core = SchedulerCore([8], batch_size, claims=True)
    core.start_batch(prefetch)
    for group in range(kept):
        core.register(("t", group), 0, group)
        core.complete(("t", group), _receipt(group), KEEP)
    assert core.collect()
    core.finish_batch()
    return core


def test_a_finished_batch_stays_handed_until_claimed_and_stale_ones_go_back():
    core = _core_with_batch(batch_size=3, prefetch=0, kept=3)
    assert [e[1].group_id for e in core.handed] == [0, 1, 2] and not core.ready
    verdicts = core.claim([(0, "a", False), (1, "a", True), (2, "a", False)])
    assert verdicts == ["train", "stale", "train"]
    assert core.take_returns() == [1] and not core.handed
    assert core.totals["claimed"] == 2 and core.totals["stale"] == 1


def test_a_top_up_batch_collects_only_the_groups_asked_for():
    core = _core_with_batch(batch_size=3, prefetch=0, kept=3)
    assert core.claim([(0, "a", False), (1, "a", True), (2, "b", False)]) == ["train", "stale", "orphan"]
    core.start_batch(prefetch=0, size=2)  # replace the stale one and the orphan: two, not a whole batch
    assert core.demand == 2 and core.budget() == 2
    for group in (3, 4):
        core.register(("t", group), 0, group)
        core.complete(("t", group), _receipt(group), KEEP)
    assert core.collect() and core.finish_batch()[0] == [_receipt(3), _receipt(4)]
    with pytest.raises(ValueError, match="size"):
        core.start_batch(prefetch=0, size=0)


def test_a_copy_no_result_stands_for_is_an_orphan():
    core = _core_with_batch(batch_size=2, prefetch=0, kept=2)
    # An earlier attempt's copy of group 0, an unknown group: neither is trained, the ledger is unchanged.
    assert core.claim([(0, "earlier", False), (9, "a", False)]) == ["orphan", "orphan"]
    assert [e[1].group_id for e in core.handed] == [0, 1] and core.totals["orphans"] == 2
    assert core.claim([(0, "a", False), (0, "a", False)]) == ["train", "orphan"]  # never twice


def test_claiming_a_ready_result_moves_a_handed_one_back_so_the_bound_holds():
    core = _core_with_batch(batch_size=2, prefetch=2, kept=4)  # 0, 1 handed; 2, 3 ready (prefetched)
    assert [e[1].group_id for e in core.ready] == [2, 3]
    assert core.claim([(0, "a", False), (2, "a", False)]) == ["train", "train"]
    # Group 1 is still in the channel, undelivered: it counts against the prefetch bound again.
    assert [e[1].group_id for e in core.ready] == [1, 3] and not core.handed
    assert [e[1].group_id for e in core.state_dict()["ready"]] == [1, 3]


def test_claim_needs_a_claims_ledger():
    core = SchedulerCore([1], 1)
    with pytest.raises(SchedulerStateError, match="claims=True"):
        core.claim([(0, None, False)])


class ChannelWorker:
    """Puts a kept group into the channel, then answers with a receipt; `hold` keeps a receipt back."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.hold: dict[int, threading.Event] = {}
        self.pool = cf.ThreadPoolExecutor(4)

    def generate_group(self, group: int, batch_id: object) -> cf.Future:
        def work() -> GroupResult:
            if group % 3 == 1:  # every third group carries no signal: filtered by the worker, never put
                return GroupResult(rewards=[1.0, 1.0], group_id=group, attempt="a", filtered="zero_variance")
            self.channel.put({"group_id": group, "attempt": "a"}, weight=10)
            if group in self.hold:
                self.hold[group].wait(10)
            return _receipt(group)

        return self.pool.submit(work)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def test_the_consumer_takes_a_token_weighted_batch_and_claims_it_exactly_once():
    channel = Channel.create("claims-test", local=True)
    worker = ChannelWorker(channel)
    worker.hold[3] = threading.Event()  # group 3 is in the channel before its receipt reaches the scheduler
    source = CountingSource()
    s = RolloutScheduler([worker], [4], source, batch_size=2, claims=True)
    try:
        batch = s.generate(0, prefetch=2)  # 0..3 dispatched at once, 1 filtered and replaced by 4, 4 by 5
        assert len(batch.groups) == 2 and all(r.payload is None for r in batch.groups)
        wait_until(lambda: channel.qsize() == 4)  # kept groups 0, 2, 3, 5; nothing filtered was put
        items = channel.get_batch(target_weight=40)  # four groups of weight 10
        assert sorted(i["group_id"] for i in items) == [0, 2, 3, 5]
        verdicts: dict = {}
        t = threading.Thread(
            target=lambda: verdicts.setdefault("v", s.claim([(i["group_id"], i["attempt"], False) for i in items]))
        )
        t.start()
        t.join(0.3)
        assert t.is_alive() and not s.stats().get("claimed")  # waits for group 3's receipt
        worker.hold[3].set()
        t.join(10)
        assert verdicts["v"] == ["train"] * 4
        stats = s.stats()
        # Nothing handed is left; `ready` may already hold new groups: once 3 and 5 were claimed the prefetch
        # (2) had room again and the scheduler thread may have dispatched and finished group 6 (a loaded
        # machine lets it win the race against this stats call), never more than the prefetch.
        assert stats["claimed"] == 4 and stats["handed"] == 0 and stats["ready"] <= 2
        assert [r.group_id for r in s.generate(1, prefetch=0).groups] == [6, 8]  # 7 filtered
        assert s.claim([(5, "a", False), (6, "a", True)]) == ["orphan", "stale"]  # 5 was claimed already
    finally:
        s.close()
        channel.close()
        worker.close()
    assert source.returned[:1] == [6]  # the stale one went back to the source; nothing claimed did
    assert not {0, 2, 3, 5} & set(source.returned)


@settings(max_examples=200, deadline=None)
@example(batch_size=1, script=[("batch", 2), ("dispatch", 0), ("complete", 1), ("batch", 0), ("dispatch", 0)])
@given(
    batch_size=st.integers(1, 4),
    script=st.lists(
        st.tuples(st.sampled_from(["batch", "dispatch", "complete", "die", "take"]), st.integers(0, 1_000)),
        max_size=150,
    ),
)
def test_claims_ledger_trains_each_group_at_most_once_and_loses_none(batch_size, script):
    """Random interleavings of dispatch, completion (put then receipt), a worker dying after its put (an orphan
    copy stays in the channel, its group is returned and re-run), and the consumer taking and claiming from the
    FIFO channel with random staleness: every dispatch ends trained, dropped, returned or still in the ledger,
    and no group is trained twice."""
    core = SchedulerCore([3, 2], batch_size, claims=True)
    ids, tokens, attempts = itertools.count(), itertools.count(), itertools.count()
    channel: list[tuple[int, int]] = []  # (group_id, attempt), FIFO
    dispatches, returned, trained, dropped = Counter(), Counter(), [], []
    backlog: list[int] = []
    prefetch = 0
    for action, n in script:
        if action == "batch" and not core.demand and not core.collecting:
            prefetch = n % 4
            core.start_batch(prefetch)
        elif action == "dispatch":
            slots = core.dispatch_slots()
            for worker in slots:
                group = backlog.pop(0) if backlog else next(ids)
                dispatches[group] += 1
                core.register(next(tokens), worker, group)
            if slots:  # dispatch never pushes past the bound; groups in flight under a larger prefetch stay
                assert len(core.pending) + len(core.ready) <= core.demand + core.prefetch
        elif action in ("complete", "die") and core.pending:
            token = list(core.pending)[n % len(core.pending)]
            group, attempt = core.pending[token][2], next(attempts)
            keep = n % 4 != 0
            if keep:
                channel.append((group, attempt))  # the worker puts before it answers
            if action == "die":
                core.fail(token)  # its receipt never comes: the group goes back, a put copy is an orphan
            else:
                core.complete(token, GroupResult([0.0, 1.0], group_id=group, attempt=attempt), KEEP if keep else DROP)
                if not keep:
                    dropped.append(group)
            if core.demand and core.collect():
                core.finish_batch()
        elif action == "take" and channel:
            taken, channel = channel[: 1 + n % 4], channel[1 + n % 4 :]
            items = [(group, attempt, (n >> k) % 5 == 0) for k, (group, attempt) in enumerate(taken)]
            for (group, _, _), verdict in zip(items, core.claim(items)):
                if verdict == "train":
                    trained.append(group)
        for group in core.take_returns():
            returned[group] += 1
            backlog.append(group)
    assert len(trained) == len(set(trained))  # never trained twice
    in_core = Counter(g for _, _, g in core.pending.values())
    in_core.update(g for _, _, g in [*core.ready, *core.handed, *core.collecting])
    assert Counter(trained) + Counter(dropped) + returned + in_core == dispatches  # each dispatch ends once
