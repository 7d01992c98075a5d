"""Slot benchmark on PostgreSQL: release-to-next-grant cycles/s vs a same-concurrency commit floor (and vs the
release alone, granting nothing: the bound on any grant design), release-to-grant latency seen from another
process (it polls for granted runs), and per-grant cost vs queue depth. The processes' bodies are in
bench/slots_procs.py.

Writes bench/results/slots.json. Uses a database of its own, `bench_slots_<pid>`, dropped when it ends.
Usage: DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python bench/slots.py [--quick] [--out PATH]
(`--smoke --out PATH`: 1 s phases, a queue of 100, 1 and 2 finishers: checks it runs, in seconds).
Browser fan-out and the outbox's drain after each commit (the Celery hand-off of a launch, the follow-ups) are
stubbed in the bench processes: they run after commit, outside the grant lock, and are measured elsewhere; what
is measured here is the slot path (the release and its commit, then the grant: lock, snapshot, grant, commit),
the effects' rows included (each statement writes its move's).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from slots_fair import measure_fair
from slots_procs import BENCH_KIND, ROOT, django_setup, finish_one, finisher_proc, poller_proc

DB_NAME = f"bench_slots_{os.getpid()}"  # per invocation: two benches never share (or drop) one database
OUT = ROOT / "bench" / "results" / "slots.json"
# Per size: seconds per timed phase, timed cycles per depth, queue depths, finisher counts, latency's finishers.
SIZES = {
    "full": (15.0, 400, (100, 10_000, 100_000), (1, 4, 16), 4),
    "quick": (4.0, 100, (100, 10_000, 100_000), (1, 4, 16), 4),
    "smoke": (1.0, 5, (100,), (1, 2), 2),
}
# Fair share on vs off (bench/slots_fair.py): waiting runs, owners, alternating rounds, timed cycles per round.
FAIR_SIZES = {"full": (10_000, 50, 5, 200), "quick": (10_000, 50, 3, 100), "smoke": (100, 5, 1, 5)}


def bench_url(base: str) -> str:
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{DB_NAME}", parts.query, ""))


def recreate_database(base: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')


def drop_database(base: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


def fill_queue(*, owner_id: int, count: int, classes: tuple[str, ...]) -> None:
    """Insert `count` waiting runs (round-robin over classes) by copying a template row in SQL: fast, and
    robust to columns other parts add to the run table."""
    from django.db import connection, transaction

    from runs.execution.kinds import rl_train_demand
    from runs.models import ORIGIN_TO_CLASS, Run
    from runs.slots.store import slot_demand

    demand = rl_train_demand({})

    origin_of = {c: o for o, c in ORIGIN_TO_CLASS.items()}
    template = Run.objects.create(
        name="bench",
        origin="system",
        run_class="system",
        kind=BENCH_KIND,
        config={},
        owner_id=owner_id,
        status="succeeded",
        resources=demand,
    )
    slot = slot_demand(demand)
    cols = [f.column for f in Run._meta.concrete_fields if f.column not in ("id", "run_class", "origin", "status")]
    class_sql = "(ARRAY[" + ",".join(f"'{c}'" for c in classes) + f"])[1 + g %% {len(classes)}]"
    origin_sql = "(ARRAY[" + ",".join(f"'{origin_of[c]}'" for c in classes) + f"])[1 + g %% {len(classes)}]"
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            f"""WITH new AS (
                  INSERT INTO runs_run ({", ".join(cols)}, run_class, origin, status)
                  SELECT {", ".join(cols)}, {class_sql}, {origin_sql}, 'queued'
                  FROM runs_run, generate_series(1, %s) g WHERE runs_run.id = %s
                  RETURNING id, run_class, owner_id)
                INSERT INTO runs_slot (run_id, run_class, state, requested_at, demand, strategy, placement, owner_id)
                SELECT id, run_class, 'waiting', clock_timestamp(), %s::jsonb, %s, '[]'::jsonb, owner_id FROM new""",
            [count, template.pk, json.dumps(slot["demand"]), slot["strategy"]],
        )
    with connection.cursor() as cur:
        cur.execute("ANALYZE runs_slot; ANALYZE runs_run")


def cluster_node() -> None:
    """One large alive node: admission grants only what fits ClusterNode capacity (no rows: nothing). Bench runs
    ask for a default run's bundles; the node fits far more of them than any policy here admits, so the grant
    decision packs real demands without ever being the limit."""
    from django.utils import timezone

    from runs.models import ClusterNode

    ClusterNode.objects.create(
        node_id="bench-node", alive=True, total={"CPU": 1000, "GPU": 0, "memory": 1 << 40}, seen_at=timezone.now()
    )


def set_policy(total: int) -> None:
    from runs.scheduling.concurrency import settings_update

    limits = {k: {"limit": total} for k in ("interactive", "app", "schedule", "system")}
    settings_update(changes={"max_total": total, "interactive_reserve": 0, "classes": limits}, partial=False, by=None)


def run_parallel(url: str, mode: str, concurrency: int, seconds: float) -> tuple[float, list[float]]:
    """Operations per second of `concurrency` processes over the same `seconds` (and, mode "latency", when each
    release started); the clock starts only once every process has set up Django and warmed up (slow process
    start-up on a busy machine is not counted)."""
    ctx = mp.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=finisher_proc, args=(url, mode, i, concurrency, ready, start, seconds, out))
        for i in range(concurrency)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=180)
    start.set()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return sum(done for done, _ in results) / seconds, sorted(t for _, starts in results for t in starts)


def measure_latency(url: str, concurrency: int, seconds: float) -> dict[str, float]:
    """Release -> grant seen in another process, with `concurrency` finishers. The queue never empties and every
    slot is held, so each release frees exactly one slot and the n-th grant needs the n-th release: pairing the
    n-th release start with the n-th grant seen gives each release's wait for a grant it made possible."""
    ctx = mp.get_context("spawn")
    ready, stop, seen_out = ctx.Event(), ctx.Event(), ctx.Queue()
    poller = ctx.Process(target=poller_proc, args=(url, ready, stop, seen_out))
    poller.start()
    ready.wait(120)
    _, starts = run_parallel(url, "latency", concurrency, seconds)
    time.sleep(0.5)  # grants of the last releases
    stop.set()
    seen = sorted(seen_out.get(timeout=60))
    poller.join()
    seen = [t for t in seen if t >= starts[0]]  # grants of the warm-up releases came before the clock started
    latencies = sorted((g - s) * 1000 for s, g in zip(starts, seen))
    print(f"latency: {len(starts)} releases, {len(seen)} grants seen", flush=True)
    return {
        "p50": round(latencies[len(latencies) // 2], 3),
        "p99": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short phases (under 2 minutes)")
    parser.add_argument("--smoke", action="store_true", help="1 s phases, small sizes (needs --out)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--fair-only", action="store_true", help="only the fair-share phase; updates its key")
    args = parser.parse_args()
    if args.smoke and args.out.resolve().is_relative_to(OUT.parent):
        parser.error("--smoke needs an --out outside bench/results/ (those files hold real measurements)")
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    if not base.startswith("postgres"):
        sys.exit("bench/slots.py needs PostgreSQL (DATABASE_URL=postgres://...)")
    recreate_database(base)
    try:
        size = "smoke" if args.smoke else "quick" if args.quick else "full"
        if args.fair_only:
            measure_fair_only(base, size=size, out=args.out)
        else:
            measure(base, size=size, out=args.out)
    finally:
        drop_database(base)  # WITH (FORCE): the bench's own connections are ended with it


def measure(base: str, *, size: str, out: Path) -> None:
    seconds, cycles, depths, finishers, latency_finishers = SIZES[size]
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
    result["fair_share"] = measure_fair(owner.pk, fill_queue, set_policy, *FAIR_SIZES[size])

    # Per-grant cost against queue depth: one process, 16 held, release+grant cycles timed one by one.
    filled = 0
    set_policy(4)
    for depth in depths:
        fill_queue(owner_id=owner.pk, count=depth - filled + cycles, classes=classes)
        filled = depth
        from runs.core.lifecycle import slots_grant

        slots_grant(reason="bench")
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
    fill_queue(owner_id=owner.pk, count=int(12_000 * seconds), classes=classes)
    connection.close()
    for concurrency in finishers:
        cycles_per_s, _ = run_parallel(url, "cycle", concurrency, seconds)
        floor_per_s, _ = run_parallel(url, "floor", concurrency, seconds)
        release_per_s, _ = run_parallel(url, "release", concurrency, seconds)
        result["finishers"][str(concurrency)] = {
            "cycles_per_s": round(cycles_per_s, 1),
            "floor_per_s": round(floor_per_s, 1),
            "ratio": round(cycles_per_s / floor_per_s, 3) if floor_per_s else 0.0,
            # The pick and the release alone (no grant): the most any grant design could reach, and its ratio.
            "release_only_per_s": round(release_per_s, 1),
            "release_only_ratio": round(release_per_s / floor_per_s, 3) if floor_per_s else 0.0,
        }
        print(f"{concurrency} finishers: {result['finishers'][str(concurrency)]}", flush=True)
    result["latency_ms"] = measure_latency(url, latency_finishers, seconds)
    print(f"latency ({latency_finishers} finishers): {result['latency_ms']}", flush=True)

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def measure_fair_only(base: str, *, size: str, out: Path) -> None:
    """Only the fair-share phase, on a fresh database; its key replaces the one in `out`, the others stay."""
    django_setup(bench_url(base))
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    owner = get_user_model().objects.create_user("bench")
    cluster_node()
    result = json.loads(out.read_text()) if out.exists() else {}
    result["fair_share"] = measure_fair(owner.pk, fill_queue, set_policy, *FAIR_SIZES[size])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["fair_share"], indent=2))


if __name__ == "__main__":
    main()
