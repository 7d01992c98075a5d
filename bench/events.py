"""Trainer-emit to browser-receive latency through the whole event path, next to the bare layer path.

full: HTTP ingest POST (per-run token) -> validate, store in PostgreSQL, fold summary -> publish after commit
      -> channels_redis pub/sub -> RunConsumer in a daphne process -> N websocket clients.
bare: channel_layer.group_send of the same-shaped message from this process -> RunConsumer -> N clients.
Both phases run in one invocation against the same daphne, Redis (a private redis-server) and PostgreSQL.
Writes bench/results/events.json: {"full": {"p50_ms", "p99_ms", "lost"}, "bare": {"p50_ms", "p99_ms"},
"ratio_p99"}. Usage: python bench/events.py [--quick] [--clients 50] [--rate 20] [--seconds 30] [--rounds 3]
[--out PATH]; `--smoke --out PATH`: 2 clients, 1 s per path, one round (checks it runs, in seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import secrets
import sys
import time
from pathlib import Path

# Settings refuse the built-in SECRET_KEY with DEBUG off; a bench run (and every process it starts) uses its own.
os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench_db import django_for_bench, percentile  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "events.json"
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/bench_events"


async def client(
    url: str,
    cookie: str,
    expect: int,
    latencies: list[float],
    ready: asyncio.Event,
    counter: list[int],
    deadline: float,
    gate: asyncio.Semaphore,
) -> set[int]:
    """One browser: receive until `expect` events or the deadline; latency = now - the event's emit time (its `ts`:
    the ingest keeps what the emitter set, and drops data fields its schema does not declare)."""
    import websockets

    seen: set[int] = set()
    for attempt in range(5):  # browsers arrive a few at a time; a refused handshake is retried, as they do
        try:
            async with gate:
                ws = await websockets.connect(
                    url,
                    additional_headers={"Cookie": f"sessionid={cookie}"},
                    origin="http://127.0.0.1",
                    open_timeout=30,
                    max_queue=None,
                )
                assert json.loads(await ws.recv())["type"] == "snapshot"
            break
        except (TimeoutError, OSError, websockets.InvalidMessage, websockets.InvalidStatus):
            await asyncio.sleep(0.5 * (attempt + 1))
    else:
        raise RuntimeError(f"could not connect to {url}")
    counter[0] += 1
    if counter[0] == counter[1]:
        ready.set()
    async with ws:
        while len(seen) < expect:
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                break
            now = time.time()
            for event in json.loads(raw)["events"]:
                if event["seq"] not in seen:
                    seen.add(event["seq"])
                    latencies.append((now - event["ts"]) * 1000)
    return seen


POST_MS: list[float] = []  # ingest request round trips, printed for context


def emit_http(base: str, run_id: int, token: str, count: int, rate: float, out) -> None:
    """The trainer's HTTP sink: one event per POST, paced on a fixed schedule (no drift)."""
    import requests

    post_ms = []
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    session.post(f"{base}/api/runs/{run_id}/ingest/", json=[], timeout=30).raise_for_status()  # warm-up heartbeat
    start = time.monotonic()
    for i in range(1, count + 1):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        event = {"seq": i, "type": "log", "ts": time.time(), "data": {"message": f"e{i}"}}
        sent = time.monotonic()
        response = session.post(f"{base}/api/runs/{run_id}/ingest/", json=[event], timeout=30)
        post_ms.append((time.monotonic() - sent) * 1000)
        response.raise_for_status()
    out.put(post_ms)


def emit_bare(run_id: int, count: int, rate: float, out) -> None:
    """Same message shape straight into the layer, from a loop of its own (not the clients' loop)."""
    import django

    django.setup()
    from channels.layers import get_channel_layer

    from runs.core.publish import run_group

    async def send_all() -> None:
        layer = get_channel_layer()
        await layer.group_send(run_group(run_id), {"type": "run.events", "events": []})  # warm-up: connects
        start = time.monotonic()
        for i in range(1, count + 1):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            event = {
                "run": run_id,
                "seq": i,
                "ts": time.time(),
                "type": "log",
                "data": {"message": f"e{i}"},
            }
            await layer.group_send(run_group(run_id), {"type": "run.events", "events": [event]})

    asyncio.run(send_all())
    out.put([])


def phase(ws_base: str, run, cookie: str, clients: int, emit, args: tuple, count: int) -> tuple[list[float], int]:
    """Connect the clients, emit `count` events, collect; returns latencies (ms) and lost deliveries."""
    latencies: list[float] = []

    async def main() -> int:
        ready, counter = asyncio.Event(), [0, clients]
        deadline = time.monotonic() + 60 + count / 5
        url = f"{ws_base}/ws/runs/{run.pk}/"
        gate = asyncio.Semaphore(10)
        tasks = [
            asyncio.create_task(client(url, cookie, count, latencies, ready, counter, deadline, gate))
            for _ in range(clients)
        ]
        await asyncio.wait_for(ready.wait(), timeout=120)
        await asyncio.sleep(0.5)
        # The emitter is a process of its own: in this one it would share the GIL with 50 clients' parsing.
        ctx = multiprocessing.get_context("spawn")  # a clean interpreter: no inherited loop, sockets or layer
        out = ctx.Queue()
        emitter = ctx.Process(target=emit, args=(*args, out))
        emitter.start()
        seen = await asyncio.gather(*tasks)
        POST_MS.extend(await asyncio.to_thread(out.get, True, 120))
        await asyncio.to_thread(emitter.join)
        return sum(count - len(s) for s in seen)

    lost = asyncio.run(main())
    return latencies, lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 s per phase instead of --seconds")
    parser.add_argument("--smoke", action="store_true", help="2 clients, 1 s per path, one round (needs --out)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate", type=float, default=20.0, help="events per second")
    parser.add_argument("--seconds", type=float, default=30.0, help="emitting time per path, over all rounds")
    parser.add_argument("--rounds", type=int, default=3, help="alternating bare/full rounds")
    parser.add_argument(
        "--no-pool",
        action="store_true",
        help="daphne without the psycopg pool (DATABASE_POOL=1 is what web processes should run)",
    )
    args = parser.parse_args()
    if args.smoke and args.out.resolve().is_relative_to(RESULTS.parent):
        parser.error("--smoke needs an --out outside bench/results/ (those files hold real measurements)")
    if args.smoke:
        args.clients = 2
    seconds = 1.0 if args.smoke else 5.0 if args.quick else args.seconds
    args.rounds = 1 if args.quick or args.smoke else args.rounds
    count = int(seconds * args.rate)

    from tests.realtime.servers import Daphne, server_env

    redis = django_for_bench(DEFAULT_DB, "bench")
    prefix, db_url = os.environ["CHANNEL_LAYER_PREFIX"], os.environ["DATABASE_URL"]
    from django.contrib.auth import get_user_model
    from django.test import Client

    from runs.models import Run, RunStatus

    user, _ = get_user_model().objects.get_or_create(username="bench-events", defaults={"is_staff": True})
    browser = Client()
    browser.force_login(user)
    cookie = browser.cookies["sessionid"].value

    def new_run(name: str) -> Run:
        return Run.objects.create(
            name=name, origin="api", run_class="app", kind="rl_train", owner=user, status=RunStatus.RUNNING
        )

    web = Daphne(
        server_env(
            database_url=db_url,
            redis_url=redis.url,
            prefix=prefix,
            DATABASE_POOL="0" if args.no_pool else "1",
            # all clients are one user: lift the per-user websocket cap (docs/realtime.md)
            WS_MAX_PER_USER=str(args.clients + 10),
        )
    )
    bare: list[float] = []
    full: list[float] = []
    lost = 0
    # Alternate short bare/full phases so drifting machine load (other work on a shared box) hits both alike.
    per_round = max(1, count // args.rounds)
    try:
        for round_no in range(args.rounds):
            bare_run, full_run = new_run(f"bench-bare-{round_no}"), new_run(f"bench-full-{round_no}")
            got, bare_lost = phase(
                web.ws, bare_run, cookie, args.clients, emit_bare, (bare_run.pk, per_round, args.rate), per_round
            )
            print(
                f"round {round_no} bare: p50 {percentile(got, 0.5):.1f} ms, p99 {percentile(got, 0.99):.1f} ms, "
                f"lost {bare_lost}",
                flush=True,
            )
            bare += got
            got, missing = phase(
                web.ws,
                full_run,
                cookie,
                args.clients,
                emit_http,
                (web.http, full_run.pk, full_run.ingest_token, per_round, args.rate),
                per_round,
            )
            print(
                f"round {round_no} full: p50 {percentile(got, 0.5):.1f} ms, p99 {percentile(got, 0.99):.1f} ms, "
                f"lost {missing}",
                flush=True,
            )
            full += got
            lost += missing
    finally:
        web.close()
        redis.close()
    result = {
        "full": {"p50_ms": round(percentile(full, 0.5), 2), "p99_ms": round(percentile(full, 0.99), 2), "lost": lost},
        "bare": {"p50_ms": round(percentile(bare, 0.5), 2), "p99_ms": round(percentile(bare, 0.99), 2)},
    }
    result["ratio_p99"] = round(result["full"]["p99_ms"] / result["bare"]["p99_ms"], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{args.clients} clients x {args.rate:g} events/s, {count} events per path in {args.rounds} rounds, "
        f"database pool {'off' if args.no_pool else 'on'} "
        f"({len(full)} full deliveries, {len(bare)} bare); ingest POST round trip "
        f"p50 {percentile(POST_MS, 0.5):.1f} ms, p99 {percentile(POST_MS, 0.99):.1f} ms"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
