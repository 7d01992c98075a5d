"""Benchmark rollout/: channel vs ray.util.queue.Queue across processes, gate lease vs asyncio.Semaphore,
scheduler overhead per group. Writes bench/results/rollout.json.

    python bench/rollout.py [--quick] [--out PATH]
    python bench/rollout.py --smoke --out PATH   (tiny sizes, one round: checks it runs; on the Ray cluster at
                                                  RAY_ADDRESS when set, as the test suite's shared head)

What is measured (baselines run in the same process, same Ray cluster, same moment):
- channel.items_per_s: a producer actor (its own process) calls put(item) once per item on a client connected
  with linger_ms=2 (write-behind: puts are buffered and sent in ordered batches, flush() at the end) into a
  named Channel actor, while this driver process takes them with get_many(--chunk): single-item puts, and a
  consumer that pulls many per call.
- channel.ray_queue_items_per_s: the same producer/consumer pair through ray.util.queue.Queue with one
  put() / get() per item (its default, single-item API).
  Also printed, not in the JSON: our channel with explicit put_many chunks, our channel with plain
  single-item put/get (no write-behind: one actor call per item each side), and Ray Queue's batch API.
- gate.lease_us: `async with gate.lease(session)` (acquire a lease, settle it with a receipt) on one loop;
  gate.semaphore_us: `async with asyncio.Semaphore` on the same loop.
- scheduler.us_per_group: wall time per delivered group of RolloutScheduler.generate() with in-process
  workers that return at once, i.e. the scheduler's own overhead (dispatch, wait, filter, collect).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollout.filters import ZeroVarianceFilter  # noqa: E402
from rollout.gate import RequestGate  # noqa: E402
from rollout.scheduler import RolloutScheduler  # noqa: E402
from rollout.types import GroupResult  # noqa: E402

OUT = ROOT / "bench" / "results" / "rollout.json"


# --- gate -------------------------------------------------------------------------------------------------
async def _gate_round(n: int) -> tuple[float, float]:
    gate = RequestGate("bench")
    sem = asyncio.Semaphore(1024)
    t0 = time.perf_counter()
    for _ in range(n):
        async with sem:
            pass
    sem_us = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for _ in range(n):
        async with gate.lease("session"):
            pass
    lease_us = (time.perf_counter() - t0) / n * 1e6
    return lease_us, sem_us


def bench_gate(n: int, rounds: int) -> dict[str, float]:
    pairs = [asyncio.run(_gate_round(n)) for _ in range(rounds)]
    # Ratio per round (same conditions), then the median: robust to load spikes on a shared machine.
    lease_us = statistics.median(p[0] for p in pairs)
    sem_us = statistics.median(p[1] for p in pairs)
    ratio = statistics.median(p[0] / p[1] for p in pairs)
    return {"lease_us": round(lease_us, 3), "semaphore_us": round(sem_us, 3), "ratio": round(ratio, 2)}


# --- scheduler --------------------------------------------------------------------------------------------
class _Source:
    def __init__(self) -> None:
        self.next = 0
        self.back: list[int] = []

    def get_groups(self, n: int) -> list[int]:
        out, self.back = self.back[:n], self.back[n:]
        while len(out) < n:
            out.append(self.next)
            self.next += 1
        return out

    def return_groups(self, groups: list[int]) -> None:
        self.back = list(groups) + self.back


class _InstantWorker:
    def generate_group(self, group: int, batch_id: object) -> GroupResult:
        return GroupResult(rewards=[0.0, 1.0], group_id=group)


def bench_scheduler(batches: int, batch_size: int) -> dict[str, float]:
    s = RolloutScheduler(
        [_InstantWorker(), _InstantWorker()],
        [batch_size // 2, batch_size // 2],
        _Source(),
        batch_size,
        filters=[ZeroVarianceFilter()],
        poll_interval_s=0.01,
    )
    s.generate(-1, prefetch=batch_size)  # warm-up: thread start
    t0 = time.perf_counter()
    for b in range(batches):
        s.generate(b, prefetch=batch_size)
    elapsed = time.perf_counter() - t0
    s.close()
    return {"us_per_group": round(elapsed / (batches * batch_size) * 1e6, 2)}


# --- channel ----------------------------------------------------------------------------------------------
def bench_channel(n_chan: int, n_queue: int, chunk: int) -> tuple[dict[str, float], dict[str, float]]:
    import ray
    from ray.util.queue import Queue

    from rollout.channel import Channel
    from rollout.channel.actor import DEFAULT_NUM_CPUS

    # Every actor asks for what it uses (the producer's loop is one busy core at most; the queue actors get
    # the channel actor's share), so the numbers are those of actors Ray really placed.
    @ray.remote(num_cpus=0.5)
    class Producer:
        def channel_many(self, ch: Channel, n: int, chunk: int) -> float:
            t0 = time.perf_counter()
            for start in range(0, n, chunk):
                ch.put_many(range(start, min(n, start + chunk)))
            return time.perf_counter() - t0

        def channel_linger(self, n: int) -> float:
            ch = Channel.connect("bench-rollout", linger_ms=2.0)
            for i in range(n):
                ch.put(i)
            ch.flush()
            return 0.0

        def channel_single(self, ch: Channel, n: int) -> float:
            for i in range(n):
                ch.put(i)
            return 0.0

        def queue_single(self, q: Queue, n: int) -> float:
            for i in range(n):
                q.put(i)
            return 0.0

        def queue_batch(self, q: Queue, n: int, chunk: int) -> float:
            for start in range(0, n, chunk):
                q.put_nowait_batch(list(range(start, min(n, start + chunk))))
            return 0.0

    producer = Producer.remote()
    ray.get(producer.queue_single.remote(None, 0))  # the producer process is up before timing starts

    def timed(start_producer, consume, n: int) -> float:
        t0 = time.perf_counter()
        ref = start_producer()
        got = 0
        while got < n:
            got += consume()
        ray.get(ref)
        return n / (time.perf_counter() - t0)

    ch = Channel.create("bench-rollout")
    try:
        timed(lambda: producer.channel_many.remote(ch, chunk * 4, chunk), lambda: len(ch.get_many(chunk)), chunk * 4)
        chan_many = timed(
            lambda: producer.channel_many.remote(ch, n_chan, chunk), lambda: len(ch.get_many(chunk)), n_chan
        )
        chan_linger = timed(lambda: producer.channel_linger.remote(n_chan), lambda: len(ch.get_many(chunk)), n_chan)
        chan_single = timed(lambda: producer.channel_single.remote(ch, n_queue), lambda: (ch.get(), 1)[1], n_queue)
    finally:
        ch.close()

    q = Queue(actor_options={"num_cpus": DEFAULT_NUM_CPUS})
    timed(lambda: producer.queue_single.remote(q, 50), lambda: (q.get(), 1)[1], 50)
    queue_single = timed(lambda: producer.queue_single.remote(q, n_queue), lambda: (q.get(), 1)[1], n_queue)

    def queue_batch_take() -> int:
        try:
            return len(q.get_nowait_batch(min(chunk, q.qsize())) if q.qsize() else [])
        except Exception:  # noqa: BLE001 - raced to empty
            return 0

    queue_batch = timed(lambda: producer.queue_batch.remote(q, n_chan, chunk), queue_batch_take, n_chan)
    q.shutdown()
    result = {
        "items_per_s": round(chan_linger, 1),
        "ray_queue_items_per_s": round(queue_single, 1),
        "ratio": round(chan_linger / queue_single, 2),
    }
    extra = {
        "channel_put_many_items_per_s": round(chan_many, 1),
        "channel_single_items_per_s": round(chan_single, 1),
        "ray_queue_batch_items_per_s": round(queue_batch, 1),
        "chunk": chunk,
    }
    return result, extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes; finishes in well under 2 minutes")
    parser.add_argument("--chunk", type=int, default=64, help="items per put_many/get_many call")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round: checks it runs (needs --out)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.smoke and args.out.resolve().is_relative_to(OUT.parent):
        parser.error("--smoke needs an --out outside bench/results/ (those files hold real measurements)")
    quick = args.quick
    started = time.perf_counter()

    gate = bench_gate(n=1_000 if args.smoke else 30_000 if quick else 200_000, rounds=1 if args.smoke else 5)
    print("gate", gate, flush=True)
    scheduler = bench_scheduler(batches=2 if args.smoke else 20 if quick else 100, batch_size=64)
    print("scheduler", scheduler, flush=True)

    import ray

    runtime_env = {"env_vars": {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}}
    shared = os.environ.get("RAY_ADDRESS") if args.smoke else None  # measurements always get a head of their own
    for attempt in range(3):
        try:
            if shared:
                ray.init(address=shared, log_to_driver=False, runtime_env=runtime_env)
            else:  # our own local head for this process only (never `ray stop`): shut down below
                ray.init(
                    address="local",
                    num_cpus=os.cpu_count() or 2,  # the machine's real cores, nothing advertised beyond them
                    include_dashboard=False,
                    log_to_driver=False,
                    runtime_env=runtime_env,
                )
            break
        except Exception:  # noqa: BLE001 - Ray's 30 s node start-up wait can lapse on a loaded machine
            ray.shutdown()
            if attempt == 2:
                raise
            print("ray.init timed out; retrying", flush=True)
    try:
        sizes = (500, 100) if args.smoke else (20_000, 1_000) if quick else (100_000, 5_000)
        channel, extra = bench_channel(n_chan=sizes[0], n_queue=sizes[1], chunk=args.chunk)
    finally:
        ray.shutdown()
    print("channel", channel, "extra", extra, flush=True)

    result = {"channel": channel, "gate": gate, "scheduler": scheduler}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} in {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
