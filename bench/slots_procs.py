"""The processes of bench/slots.py (started with spawn, so each imports this module, not the bench's main):
the Django set-up of a bench process, and what a finisher, a floor process and the grant poller do.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import sys
import time
from datetime import timedelta
from pathlib import Path

# Settings refuse the built-in SECRET_KEY with DEBUG off; a bench run (and every process it starts) uses its own.
os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))

ROOT = Path(__file__).resolve().parent.parent
BENCH_KIND = "bench"


def django_setup(url: str) -> None:
    """Point this process at the bench database and make it a slot client without fan-out or a broker."""
    sys.path.insert(0, str(ROOT))
    os.environ["DATABASE_URL"] = url
    os.environ["CELERY_TASK_ALWAYS_EAGER"] = "1"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    import runs.core.lifecycle
    import runs.core.moves
    import runs.core.publish
    import runs.core.stores
    import runs.scheduling.concurrency
    import runs.scheduling.enqueue
    from runs.execution.kinds import KINDS, RunKind, rl_train_demand

    noop = lambda *a, **k: None  # noqa: E731
    runs.core.publish.run_event_publish = runs.core.publish.dashboard_publish = noop
    runs.core.moves.dashboard_publish = runs.core.moves.run_event_publish = runs.core.stores.run_event_publish = noop
    runs.scheduling.enqueue.dashboard_publish = runs.scheduling.concurrency.dashboard_publish = noop
    # The outbox's drain after each commit (the launch's hand-off to Celery, a broker publish in production; the
    # follow-ups, which a bench run has none of) is no part of the release -> grant path measured here; the
    # effects' rows are: the release and grant statements write them.
    runs.core.lifecycle.effects_kick = noop
    # Bench runs ask for what a default training run asks for (its six bundles), so every grant decision packs a
    # real demand against the cluster's free resources, as production grants do.
    KINDS[BENCH_KIND] = RunKind(
        name=BENCH_KIND, validate_config=lambda c: c, json_schema=dict, demand=lambda c: rl_train_demand({})
    )


def pick(state: str, index: int, finishers: int) -> tuple[int] | None:
    """One run of this finisher's share whose slot is in `state` (a hash of the run id modulo the number of
    finishers, so no two pick the same run; not the id itself: runs are queued round-robin over the classes)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT run_id FROM runs_slot WHERE state = %s AND abs(hashint8(run_id)) %% %s = %s LIMIT 1",
            [state, finishers, index],
        )
        return cur.fetchone()


def finish_one(index: int = 0, finishers: int = 1) -> bool:
    """Finish one held run of this finisher's share (`pick`) by calling run_finish outside any transaction, as its
    production callers do (the ingest of a job's final event, the launcher, reconcile). The next grant follows
    the release's commit. False: none held."""
    from runs.core.lifecycle import run_finish
    from runs.models import Run

    row = pick("held", index, finishers)
    if row is None:
        time.sleep(0.0005)  # every held run of this share is finished; the next grants may land in it
        return False
    run_finish(run=Run(pk=row[0]), status="succeeded")
    return True


def release_one(index: int, finishers: int) -> bool:
    """The release alone, as a bound on any grant design: cancel one waiting run of this finisher's share with
    the release statement `run_finish` uses (run row, numbered status event, slot deleted; autocommit), and
    grant nothing. A cycle can be no faster than this pick plus this release."""
    from django.utils import timezone

    from runs.core.lifecycle import allowed_from, stamp
    from runs.core.stores import PG_STORE
    from runs.models import RunStatus

    row = pick("waiting", index, finishers)
    if row is None:
        return False
    now, status = timezone.now(), RunStatus.CANCELLED
    run, _ = PG_STORE.finish(  # the store call run_finish makes, without its probe (so: no grant)
        run_id=row[0],
        status=status,
        error="",
        now=now,
        allowed=allowed_from(status),
        columns=stamp(status, now),
        effects=[],  # a cancel of a queued run implies none
    )
    return run is not None


def finisher_proc(
    url: str, mode: str, index: int, count: int, ready: mp.Queue, start: mp.Event, seconds: float, out: mp.Queue
) -> None:
    django_setup(url)
    from django.db import connection

    def step() -> bool:
        if mode == "floor":
            with connection.cursor() as cur:  # autocommit: one committed single-row UPDATE per iteration
                cur.execute("UPDATE bench_floor SET n = n + 1 WHERE id = %s", [index])
            return True
        if mode == "release":
            return release_one(index, count)
        return finish_one(index, count)

    if mode == "floor":
        with connection.cursor() as cur:
            cur.execute("INSERT INTO bench_floor (id, n) VALUES (%s, 0) ON CONFLICT (id) DO NOTHING", [index])
    for _ in range(3):  # warm: connection open, imports done, plans and caches filled
        step()
    ready.put(index)
    start.wait()
    done, starts, deadline = 0, [], time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.time()
        if step():
            done += 1
            starts.append(started)
    out.put((done, starts if mode == "latency" else []))


def poller_proc(url: str, ready: mp.Event, stop: mp.Event, out: mp.Queue) -> None:
    """Another process watching for grants: polls for newly granted runs (about every 0.5 ms) and records when
    it first saw each. Grants are serialized under the lock, so granted_at hardly ever goes back across commits:
    each poll reads from 50 ms before the latest granted_at seen."""
    django_setup(url)
    from django.db import connection

    seen: set[int] = set()
    seen_at: list[float] = []
    margin = timedelta(milliseconds=50)
    with connection.cursor() as cur:
        cur.execute("SELECT max(granted_at) FROM runs_run")
        since = cur.fetchone()[0]
        cur.execute("SELECT id FROM runs_run WHERE granted_at >= %s", [since - margin])
        seen.update(r[0] for r in cur.fetchall())
        ready.set()
        while not stop.is_set():
            cur.execute("SELECT id, granted_at FROM runs_run WHERE granted_at >= %s", [since - margin])
            now = time.time()
            for run_id, granted_at in cur.fetchall():
                if run_id not in seen:
                    seen.add(run_id)
                    seen_at.append(now)
                    since = max(since, granted_at)
            time.sleep(0.0005)
    out.put(seen_at)
