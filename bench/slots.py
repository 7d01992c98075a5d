"""Slot benchmark on PostgreSQL: release-to-next-grant cycles/s vs a same-concurrency commit floor,
release-to-start latency across processes (LISTEN/NOTIFY), and per-grant cost vs queue depth.

Writes bench/results/slots.json. Uses its own database `bench_slots` (dropped and re-created).
Usage: DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python bench/slots.py [--quick]
Browser fan-out and the Celery hand-off (`dispatch_run.delay`) are stubbed in the bench processes: both run
after commit, outside the grant lock, and are measured elsewhere; what is measured here is the slot path
(lock, release, grant, commit).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# Settings refuse the built-in SECRET_KEY with DEBUG off; a bench run (and every process it starts) uses its own.
os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "bench_slots"
BENCH_KIND = "bench"


def bench_url(base: str) -> str:
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{DB_NAME}", parts.query, ""))


def django_setup(url: str) -> None:
    """Point this process at the bench database and make it a slot client without fan-out or a broker."""
    sys.path.insert(0, str(ROOT))
    os.environ["DATABASE_URL"] = url
    os.environ["CELERY_TASK_ALWAYS_EAGER"] = "1"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    import runs.realtime
    import runs.services
    import runs.tasks
    from runs.kinds import RunKind, kind_register

    noop = lambda *a, **k: None  # noqa: E731
    runs.realtime.run_event_publish = runs.realtime.dashboard_publish = noop
    runs.services.dashboard_publish = runs.services.run_event_publish = noop
    # The after-commit hand-off to Celery is a broker publish in production; eager mode would run the worker's
    # task body inside the finisher instead, which is no part of the release -> grant path measured here.
    runs.tasks.dispatch_run.delay = noop
    kind_register(RunKind(name=BENCH_KIND, validate_config=lambda c: c, json_schema=dict, launch=noop))


def recreate_database(base: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')


def fill_queue(*, owner_id: int, count: int, classes: tuple[str, ...]) -> None:
    """Insert `count` waiting runs (round-robin over classes) by copying a template row in SQL: fast, and
    robust to columns other parts add to the run table."""
    from django.db import connection, transaction

    from runs.models import ORIGIN_TO_CLASS, Run

    origin_of = {c: o for o, c in ORIGIN_TO_CLASS.items()}
    template = Run.objects.create(
        name="bench",
        origin="system",
        run_class="system",
        kind=BENCH_KIND,
        config={},
        owner_id=owner_id,
        status="succeeded",
    )
    cols = [f.column for f in Run._meta.concrete_fields if f.column not in ("id", "run_class", "origin", "status")]
    class_sql = "(ARRAY[" + ",".join(f"'{c}'" for c in classes) + f"])[1 + g %% {len(classes)}]"
    origin_sql = "(ARRAY[" + ",".join(f"'{origin_of[c]}'" for c in classes) + f"])[1 + g %% {len(classes)}]"
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            f"""WITH new AS (
                  INSERT INTO runs_run ({", ".join(cols)}, run_class, origin, status)
                  SELECT {", ".join(cols)}, {class_sql}, {origin_sql}, 'queued'
                  FROM runs_run, generate_series(1, %s) g WHERE runs_run.id = %s
                  RETURNING id, run_class)
                INSERT INTO runs_slot (run_id, run_class, state, requested_at)
                SELECT id, run_class, 'waiting', clock_timestamp() FROM new""",
            [count, template.pk],
        )
    with connection.cursor() as cur:
        cur.execute("ANALYZE runs_slot; ANALYZE runs_run")


def cluster_node() -> None:
    """One large alive node: admission grants only what fits ClusterNode capacity (no rows: nothing). Bench runs
    need nothing (empty demand), so it only has to exist."""
    from django.utils import timezone

    from runs.models import ClusterNode

    ClusterNode.objects.create(
        node_id="bench-node", alive=True, total={"CPU": 1000, "GPU": 0, "memory": 1 << 40}, seen_at=timezone.now()
    )


def set_policy(total: int) -> None:
    from runs import services

    limits = {k: {"limit": total} for k in ("interactive", "app", "schedule", "system")}
    services.settings_update(
        changes={"max_total": total, "interactive_reserve": 0, "classes": limits}, partial=False, by=None
    )


def finish_one() -> bool:
    """Claim one held run (SKIP LOCKED, so concurrent finishers never pick the same) and finish it: the release
    and the next grant commit together. True when a waiting run was granted by it."""
    from django.db import transaction

    from runs import services
    from runs.models import Run, Slot, SlotState

    with transaction.atomic():
        run_id = (
            Slot.objects.select_for_update(skip_locked=True)
            .filter(state=SlotState.HELD)
            .values_list("run_id", flat=True)
            .first()
        )
        if run_id is None:
            return False
        services.run_finish(run=Run(pk=run_id), status="succeeded")
    return True


def finisher_proc(
    url: str, mode: str, index: int, ready: mp.Queue, start: mp.Event, seconds: float, out: mp.Queue
) -> None:
    django_setup(url)
    from django.db import connection

    def step() -> bool:
        if mode == "floor":
            with connection.cursor() as cur:  # autocommit: one committed single-row UPDATE per iteration
                cur.execute("UPDATE bench_floor SET n = n + 1 WHERE id = %s", [index])
            return True
        return finish_one()

    if mode == "floor":
        with connection.cursor() as cur:
            cur.execute("INSERT INTO bench_floor (id, n) VALUES (%s, 0) ON CONFLICT (id) DO NOTHING", [index])
    for _ in range(3):  # warm: connection open, imports done, plans and caches filled
        step()
    ready.put(index)
    start.wait()
    done, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if step():
            done += 1
    out.put(done)


def listener_proc(url: str, ready: mp.Event, stop: mp.Event, out: mp.Queue) -> None:
    """Another process waiting for slot changes: latency = notification received - release started."""
    django_setup(url)
    from runs.notify import slots_listen

    latencies: list[float] = []
    ready.set()
    while not stop.is_set():
        for payload in slots_listen(timeout=0.5):  # returns after 0.5 s without a notification
            now = time.time()
            if payload.get("reason") == "release" and payload.get("granted"):
                latencies.append((now - payload["t"]) * 1000)
            if stop.is_set():
                break
    out.put(latencies)


def run_parallel(url: str, mode: str, concurrency: int, seconds: float) -> float:
    """Operations per second of `concurrency` processes over the same `seconds`; the clock starts only once
    every process has set up Django and warmed up (slow process start-up on a busy machine is not counted)."""
    ctx = mp.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=finisher_proc, args=(url, mode, i, ready, start, seconds, out)) for i in range(concurrency)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=180)
    start.set()
    total = sum(out.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join()
    return total / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short phases (under 2 minutes)")
    args = parser.parse_args()
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    if not base.startswith("postgres"):
        sys.exit("bench/slots.py needs PostgreSQL (DATABASE_URL=postgres://...)")
    seconds = 4.0 if args.quick else 15.0
    recreate_database(base)
    url = bench_url(base)
    django_setup(url)
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE bench_floor (id int PRIMARY KEY, n bigint NOT NULL)")
    owner = get_user_model().objects.create_user("bench")
    cluster_node()
    classes = ("interactive", "app", "schedule", "system")
    result: dict = {"finishers": {}, "latency_ms": {}, "depth_ms_per_grant": {}}

    # Per-grant cost against queue depth: one process, 16 held, release+grant cycles timed one by one.
    cycles = 100 if args.quick else 400
    filled = 0
    set_policy(4)
    for depth in (100, 10_000, 100_000):
        fill_queue(owner_id=owner.pk, count=depth - filled + cycles, classes=classes)
        filled = depth
        from runs import services

        services.slots_grant(reason="bench")
        for _ in range(20):  # warm up caches and plans
            finish_one()
        times = []
        for _ in range(cycles):
            t0 = time.perf_counter()
            finish_one()
            times.append((time.perf_counter() - t0) * 1000)
        result["depth_ms_per_grant"][str(depth)] = round(statistics.median(times), 3)
        print(
            f"depth {depth}: {result['depth_ms_per_grant'][str(depth)]} ms per grant (median of {cycles})", flush=True
        )

    # Throughput: N finishers releasing and granting, against N processes doing minimal committed UPDATEs.
    set_policy(16)
    fill_queue(owner_id=owner.pk, count=int(2500 * seconds), classes=classes)
    connection.close()
    ctx = mp.get_context("spawn")
    for concurrency in (1, 4, 16):
        latency_out = ctx.Queue()
        ready, stop = ctx.Event(), ctx.Event()
        listener = None
        if concurrency == 4:
            listener = ctx.Process(target=listener_proc, args=(url, ready, stop, latency_out))
            listener.start()
            ready.wait(60)
        cycles_per_s = run_parallel(url, "cycle", concurrency, seconds)
        if listener is not None:
            stop.set()
            latencies = sorted(latency_out.get(timeout=60))
            listener.join()
            result["latency_ms"] = {
                "p50": round(latencies[len(latencies) // 2], 3),
                "p99": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3),
            }
            print(f"latency over {len(latencies)} releases: {result['latency_ms']}", flush=True)
        floor_per_s = run_parallel(url, "floor", concurrency, seconds)
        result["finishers"][str(concurrency)] = {
            "cycles_per_s": round(cycles_per_s, 1),
            "floor_per_s": round(floor_per_s, 1),
            "ratio": round(cycles_per_s / floor_per_s, 3) if floor_per_s else 0.0,
        }
        print(f"{concurrency} finishers: {result['finishers'][str(concurrency)]}", flush=True)

    out = ROOT / "bench" / "results" / "slots.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
