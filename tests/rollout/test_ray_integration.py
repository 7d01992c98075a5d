"""Rollout pieces on a real Ray cluster: killed worker retired with results recovered, channel across processes,
publication across engine actors, a killed engine's sessions turned into tombstones."""

import asyncio
import threading
import time

import pytest

from rollout.channel import Channel
from rollout.errors import ChannelError, QueueEmpty, QueueFull, SessionGoneError
from rollout.filters import KEEP
from rollout.invoke import call
from rollout.publication import PublicationController
from rollout.router import SessionAffinityRouter
from rollout.scheduler import RolloutScheduler
from tests.rollout.fakes import CountingSource, wait_until
from tests.rollout.ray_actors import ChannelProducer, GatedEngine, GroupWorker

ACTOR = {"num_cpus": 0.1}


def _dead(ray, handle) -> bool:
    try:
        ray.get(handle.finished.remote(), timeout=10)
        return False
    except ray.exceptions.RayActorError:
        return True
    except ray.exceptions.GetTimeoutError:
        return False


def test_killed_ray_worker_is_retired_and_its_finished_result_recovered(ray_driver):
    ray = ray_driver
    remote = ray.remote(GroupWorker).options(**ACTOR, max_concurrency=8, max_restarts=0)
    w0, w1 = remote.remote(hang=True), remote.remote()
    blocked, release = threading.Event(), threading.Event()

    def holding_filter(result):
        # Holds the scheduler thread while group 2 is processed, so group 1 finishes on w0 unobserved.
        if result.group_id == 2:
            blocked.set()
            release.wait(30)
        return KEEP

    source = CountingSource()
    # Capacities [2, 1]: groups 0 and 1 go to w0, group 2 to w1.
    s = RolloutScheduler([w0, w1], [2, 1], source, batch_size=3, filters=[holding_filter])
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("batch", s.generate(0, prefetch=0)))
    t.start()
    try:
        assert blocked.wait(60)
        # Group 1 completes on w0 only now, while the scheduler thread is held: nobody has seen its result.
        ray.get(w0.release.remote())
        wait_until(lambda: ray.get(w0.finished.remote()) == [1], timeout=60)
        ray.kill(w0, no_restart=True)
        wait_until(lambda: _dead(ray, w0), timeout=60)
        # The driver must also see both of w0's calls resolved (group 0 failed, group 1 done) before the
        # scheduler looks again; otherwise it may take group 1 as an ordinary result and never retire w0 first.
        with s._cond:
            w0_calls = [token for token, (worker, _, _) in s._core.pending.items() if worker == 0]
        assert len(w0_calls) == 2
        wait_until(lambda: len(ray.wait(w0_calls, num_returns=2, timeout=0, fetch_local=False)[0]) == 2, timeout=60)
        release.set()
        t.join(60)
        batch = out["batch"]
        assert sorted(g.group_id for g in batch.groups) == [0, 1, 2]
        stats = s.stats()
        assert stats["capacities"] == [0, 1] and stats["workers_alive"] == 1
        assert stats["recovered"] == 1  # group 1's result outlived its worker
        assert source.returned == [0]  # the unfinished group went back and was regenerated on w1
    finally:
        release.set()
        s.close(timeout_s=10)


def test_channel_across_processes_with_hooks(ray_driver):
    ray = ray_driver
    ch = Channel.create("ray-chan", maxsize=0, collector="rollout.channel.hooks:SplitCollector")
    try:
        producer = ray.remote(ChannelProducer).options(**ACTOR).remote()
        # One producer connects by name, the other receives the pickled handle.
        refs = [producer.produce.remote(None, 50, 10), producer.produce.remote(ch, 30, 7)]
        assert ray.get(refs) == [50, 30]
        assert ch.qsize() == 80
        got = []
        while len(got) < 80:
            got += ch.get_batch(16, timeout=10)
        assert sorted(got) == sorted(list(range(50)) + list(range(30)))
        # Write-behind single-item puts from another process keep their order and are all delivered.
        assert ray.get(producer.produce_single.remote(200, 2.0)) == 200
        assert ch.get_many(500, timeout=10) == [f"single-{i}" for i in range(200)]
        with pytest.raises(ChannelError, match="unbounded Ray channel"):
            Channel.create("never", local=True, linger_ms=2)
        ch.put([1, 2])  # split by the collector inside the actor process
        assert ch.get_many(5) == [1, 2]
        with pytest.raises(QueueEmpty):
            ch.get_nowait()
        with pytest.raises(TimeoutError):
            ch.get(timeout=0.05)
        assert "Channel[ray]('ray-chan'" in repr(ch) and "SplitCollector" in repr(ch)

        async def consume():
            task = asyncio.create_task(ch.get_async(timeout=10))
            await asyncio.sleep(0.05)
            await ch.put_async("async-item")
            return await task

        assert asyncio.run(consume()) == "async-item"
    finally:
        ch.close()
    with pytest.raises(ChannelError, match="no channel named"):
        Channel.connect("ray-chan")


def test_bounded_ray_channel_raises_queue_full(ray_driver):
    ch = Channel.create("ray-bounded", maxsize=2)
    try:
        ch.put_nowait("a")
        ch.put_nowait("b")
        assert ch.full()
        with pytest.raises(QueueFull):
            ch.put_nowait("c")
        with pytest.raises(TimeoutError):
            ch.put("c", timeout=0.05)
        assert ch.get() == "a"
    finally:
        ch.close()


def test_publication_across_engine_actors_and_killed_engine_tombstones(ray_driver):
    ray = ray_driver
    remote = ray.remote(GatedEngine).options(**ACTOR, max_concurrency=16, max_restarts=0)
    engines = {f"e{i}": remote.remote(f"e{i}") for i in range(2)}
    router = SessionAffinityRouter(engines)
    pc = PublicationController(engines)

    async def main():
        first = {}
        for i in range(4):
            sid = f"s{i}"
            first[sid] = router.acquire(sid)
            out = await engines[first[sid]].generate.remote(sid, "abc")
            assert out["version"] == 0
        await pc.prepare(timeout_s=10)
        await pc.publish(1, weights={"layer": [1, 2]})
        data = await pc.snapshot()
        assert data["state"] == "open" and data["version"] == 1 and len(data["engines"]) == 2
        for sid, engine in first.items():
            assert router.acquire(sid) == engine
            assert (await engines[engine].generate.remote(sid, "x"))["version"] == 1
        # An engine dies: the driver notices through a failed call and tombstones its sessions.
        ray.kill(engines["e0"], no_restart=True)
        deadline = time.monotonic() + 30
        while True:  # ray.kill is asynchronous: wait until calls fail
            try:
                await call(engines["e0"], "snapshot")
            except ray.exceptions.RayActorError:
                break
            assert time.monotonic() < deadline, "killed engine still answers"
            await asyncio.sleep(0.1)
        data = await pc.snapshot()
        assert data["state"] == "poisoned" and "unreachable" in data["engines"][0]["error"]
        gone = router.remove_engine("e0", reason="actor died")
        pc.remove_engine("e0")
        assert sorted(gone) == sorted(s for s, e in first.items() if e == "e0")
        for sid in gone:
            with pytest.raises(SessionGoneError, match="actor died"):
                router.acquire(sid)
        assert router.acquire("fresh") == "e1"
        await pc.prepare(timeout_s=10)
        await pc.publish(2)
        assert (await pc.snapshot())["version"] == 2

    try:
        asyncio.run(main())
    finally:
        for handle in engines.values():
            ray.kill(handle)
