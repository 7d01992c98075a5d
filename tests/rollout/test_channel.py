"""Channel (local mode): put/get sync and async, nowait errors, sizes, keys, weighted get_batch, hooks, repr."""

import asyncio
import threading

import pytest

from rollout.channel import Channel, Collector, register_collector
from rollout.errors import ChannelError, QueueEmpty, QueueFull


@pytest.fixture
def make_channel():
    made = []

    def make(name, **kw):
        ch = Channel.create(name, local=True, **kw)
        made.append(ch)
        return ch

    yield make
    for ch in made:
        ch.close()


def test_fifo_sizes_and_nowait_errors(make_channel):
    ch = make_channel("fifo", maxsize=2)
    assert ch.empty() and not ch.full()
    ch.put("a")
    ch.put_nowait("b")
    assert ch.qsize() == 2 and ch.full()
    with pytest.raises(QueueFull):
        ch.put_nowait("c")
    with pytest.raises(asyncio.QueueFull):  # also the asyncio class, like asyncio.Queue
        ch.put_nowait("c")
    with pytest.raises(TimeoutError):
        ch.put("c", timeout=0.02)
    assert [ch.get(), ch.get_nowait()] == ["a", "b"]
    with pytest.raises(QueueEmpty):
        ch.get_nowait()
    with pytest.raises(TimeoutError, match="stayed empty"):
        ch.get(timeout=0.02)


def test_keys_are_separate_queues(make_channel):
    ch = make_channel("keys", maxsize=1)
    ch.put(1, key="a")
    ch.put(2, key="b")  # key a being full does not block key b
    assert (ch.qsize("a"), ch.qsize("b"), ch.full("a")) == (1, 1, True)
    assert ch.get(key="b") == 2 and ch.get(key="a") == 1


def test_blocking_get_woken_by_put_from_another_thread(make_channel):
    ch = make_channel("wake")
    threading.Timer(0.05, lambda: ch.put("late")).start()
    assert ch.get(timeout=5) == "late"


def test_async_put_get_and_cancellation_loses_nothing(make_channel):
    ch = make_channel("async", maxsize=1)

    async def main():
        waiter = asyncio.create_task(ch.get_async())
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        await ch.put_async("x")
        blocked = asyncio.create_task(ch.put_async("y"))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        assert await ch.get_async() == "x"
        await blocked
        assert await ch.get_batch_async(5) == ["y"]

    asyncio.run(main())
    assert ch.empty()


def test_get_batch_weight_edge_cases(make_channel):
    ch = make_channel("w")
    with pytest.raises(ChannelError, match="target_weight"):
        ch.get_batch(0)
    with pytest.raises(ChannelError, match="weight"):
        ch.put("bad", weight=-1)
    with pytest.raises(ChannelError, match="weight"):
        ch.put("bad", weight=float("nan"))
    with pytest.raises(ChannelError, match="number"):
        ch.put("bad", weight=True)
    ch.put_many(["heavy", "a", "b", "c", "z1", "z2"], weights=[10, 2, 3, 4, 0, 0])
    assert ch.get_batch(5) == ["heavy"]  # heavier than the target alone: still returned, no stall
    assert ch.get_batch(5) == ["a", "b"]  # exactly the target
    assert ch.get_batch(4.5) == ["c", "z1", "z2"]  # zero weights ride along
    ch.put_many(range(5), weights=[0] * 5)
    assert ch.get_batch(1, max_items=2) == [0, 1]
    # Blocks until at least one item arrives, never returns an empty batch.
    threading.Timer(0.05, lambda: ch.put("late", weight=7)).start()
    assert ch.get_batch(1, timeout=5) == [2, 3, 4]
    assert ch.get_batch(1, timeout=5) == ["late"]
    with pytest.raises(ChannelError, match="2 items but 1 weights"):
        ch.put_many([1, 2], weights=[1])


@register_collector("test-tokens")
class TokenCollector(Collector):
    """Splits a (prompt, n) item into n items under key 'tok' weighted 1, drops None."""

    def collect(self, item, key):
        if item is None:
            return
        prompt, n = item
        for i in range(n):
            yield "tok", f"{prompt}-{i}", 1


def test_collector_by_registered_name_transforms_splits_filters_rekeys(make_channel):
    ch = make_channel("coll", collector="test-tokens")
    ch.put(("p", 3))
    ch.put(None)
    assert ch.qsize() == 0 and ch.qsize("tok") == 3
    assert ch.get_batch(2, key="tok") == ["p-0", "p-1"]


def test_collector_by_module_path_and_errors(make_channel):
    ch = make_channel("path", collector="rollout.channel.hooks:SplitCollector")
    ch.put([1, 2, 3])
    assert ch.get_many(10) == [1, 2, 3]
    with pytest.raises(ChannelError, match="unknown collector"):
        Channel.create("bad1", local=True, collector="nope")
    with pytest.raises(ChannelError, match="cannot be imported"):
        Channel.create("bad2", local=True, collector="rollout.nothing:Nope")
    with pytest.raises(ChannelError, match="is not a Collector"):
        Channel.create("bad3", local=True, collector=object)


class Counting(Collector):
    """Weighs an item by its length and counts items per key: what Channel.metrics reports."""

    def setup(self, ctx):
        super().setup(ctx)
        self.seen: dict[str, int] = {}

    def collect(self, item, key):
        self.seen[key] = self.seen.get(key, 0) + 1
        yield key, item, len(item)

    def metrics(self):
        return {f"{key}/seen": float(n) for key, n in self.seen.items()}


def test_collector_weighs_and_counts_and_metrics_and_repr_report_it(make_channel):
    ch = make_channel("count", collector=Counting, maxsize=10)
    ch.put_many(["aa", "bbb", "c"], key="k")
    ch.put("dd")
    assert ch.get_batch(5, key="k") == ["aa", "bbb"]  # weights 2 + 3 fit 5, the next would not
    assert ch.metrics() == {"k/queued": 1.0, "default/queued": 1.0, "k/seen": 3.0, "default/seen": 1.0}
    text = repr(ch)
    assert "Channel[local]('count'" in text and "Counting" in text and "maxsize=10" in text


def test_connect_finds_local_channel_and_unknown_name_is_clear(make_channel):
    ch = make_channel("conn")
    ch.put(5)
    assert Channel.connect("conn").get() == 5
    with pytest.raises(ChannelError, match="already exists"):
        Channel.create("conn", local=True)
    import pickle

    with pytest.raises(ChannelError, match="cannot leave its process"):
        pickle.dumps(ch)


def test_many_threads_bounded_channel_delivers_each_item_once(make_channel):
    ch = make_channel("stress", maxsize=8)
    produced = [[(p, i) for i in range(300)] for p in range(3)]
    got: list = []
    lock = threading.Lock()

    def produce(items):
        for k in range(0, len(items), 5):
            ch.put_many(items[k : k + 5], timeout=10) if k % 2 else [ch.put(x, timeout=10) for x in items[k : k + 5]]

    per_consumer: list[list] = [[], [], []]

    def consume(mine: list):
        while True:
            try:
                items = ch.get_many(7, timeout=0.5)
            except TimeoutError:
                return
            mine.extend(items)
            with lock:
                got.extend(items)

    threads = [threading.Thread(target=produce, args=(items,)) for items in produced]
    threads += [threading.Thread(target=consume, args=(mine,)) for mine in per_consumer]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(got) == sorted(x for items in produced for x in items)
    for mine in per_consumer:  # each consumer sees every producer's items in FIFO order
        for p in range(3):
            seq = [i for q, i in mine if q == p]
            assert seq == sorted(seq)
