"""Dashboard performance, measured in headless Chromium against a real daphne + PostgreSQL + Redis.

Writes bench/results/dashboard.json with
  first_render_ms  queue board with 1,000 queued and 20 running: navigation start -> board drawn (median)
  bundle_gzip_kb   every JS + CSS file the pages ship (frontend/static/dist), gzip -9
  frame_p95_ms     run page while its run emits 50 events/s through the real ingest endpoint: p95 frame time
next to same-run baselines (empty board, idle run page, uPlot alone) and their ratios.
Usage: python bench/dashboard.py [--quick] [--out PATH]   (DATABASE_URL: a PostgreSQL server; a scratch database
of its own, `bench_dashboard_<pid>`, dropped at the end). `--smoke --out PATH`: 10 queued and 2 running, one
repetition, a 1 s stream (checks it runs, in seconds).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

# Settings refuse the built-in SECRET_KEY with DEBUG off; a bench run (and every process it starts) uses its own.
os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
BASE_DB_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
SCRATCH_DB = f"bench_dashboard_{os.getpid()}"  # per invocation: two runs never share (or drop) one database
DB_URL = urlunparse(urlparse(BASE_DB_URL)._replace(path=f"/{SCRATCH_DB}"))
os.environ["DATABASE_URL"] = DB_URL
OUT = REPO / "bench" / "results" / "dashboard.json"
REDIS_URL = os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/1")
# Playwright's sync API runs an event loop in this thread; the ORM calls here are plain sync calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"


def scratch_database() -> None:
    import psycopg

    with psycopg.connect(BASE_DB_URL, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {SCRATCH_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {SCRATCH_DB}")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, check=True, env=dict(os.environ))


def bundle_kb() -> tuple[float, float]:
    dist = REPO / "frontend" / "static" / "dist"
    if not (dist / "board.js").exists():
        subprocess.run(["node", "frontend/build.mjs"], cwd=REPO, check=True)
    total = sum(len(gzip.compress(p.read_bytes(), 9)) for p in dist.rglob("*") if p.suffix in {".js", ".css"})
    uplot = REPO / "node_modules" / "uplot" / "dist"
    lib = sum(len(gzip.compress((uplot / n).read_bytes(), 9)) for n in ("uPlot.iife.min.js", "uPlot.min.css"))
    return total / 1024, lib / 1024


def wait_js(page, predicate: str, timeout: float = 30.0) -> None:
    """Poll a JS function until it returns true. Not `page.wait_for_function`: Playwright evaluates its
    predicate from a string, which the pages' CSP (script-src 'self', no 'unsafe-eval') refuses."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(predicate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {predicate}")
        time.sleep(0.02)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and a shorter event stream")
    ap.add_argument("--smoke", action="store_true", help="a small board, one repetition, 1 s stream (needs --out)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.smoke and args.out.resolve().is_relative_to(OUT.parent):
        ap.error("--smoke needs an --out outside bench/results/ (those files hold real measurements)")
    reps, stream_s = (1, 1.0) if args.smoke else (3, 4.0) if args.quick else (7, 10.0)
    queued, running_n = (10, 2) if args.smoke else (1000, 20)

    scratch_database()
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.utils import timezone
    from playwright.sync_api import sync_playwright

    from runs import tasks
    from runs.core import publish
    from runs.core.lifecycle import run_transition
    from runs.execution.submit import run_submit
    from runs.models import ClusterNode, Run, RunStatus
    from runs.scheduling.concurrency import settings_update
    from runs.telemetry import realtime
    from tests.browser.stack import CHROMIUM, CHROMIUM_ARGS, Emitter, free_port, server_start

    # Seeding goes through the real services; live fan-out and Celery hand-off are not what is measured.
    publish.group_send_now = realtime.group_send_now = lambda group, message: None
    tasks.dispatch_run.delay = lambda run_id: None
    user = get_user_model().objects.create_user("bench", password="pw", is_staff=True)
    # Admission grants only what fits the alive nodes the tick read from Ray; here there is no Ray, so one node as
    # large as the seeded runs need stands for it (the test suite's cluster_capacity fixture does the same).
    ClusterNode.objects.create(
        node_id="bench-node",
        address="127.0.0.1",
        alive=True,
        total={"CPU": 1000.0, "GPU": 64.0, "memory": 1 << 40},
        seen_at=timezone.now(),
    )
    client = Client()
    client.force_login(user)
    session = client.cookies["sessionid"].value

    server = server_start(
        database_url=DB_URL,
        redis_url=REDIS_URL,
        extra_env={"CELERY_TASK_ALWAYS_EAGER": "1", "RAY_ADDRESS": f"http://127.0.0.1:{free_port()}"},
    )
    results: dict = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            ctx = browser.new_context(viewport={"width": 1360, "height": 900})
            ctx.add_cookies([{"name": "sessionid", "value": session, "url": server.url}])
            page = ctx.new_page()

            breakdown: dict[str, list[float]] = {"ttfb": [], "client": []}

            def board_ms() -> float:
                """Median of navigation start -> board drawn; also splits it into server wait and browser work."""
                samples = []
                breakdown["ttfb"].clear()
                breakdown["client"].clear()
                for _ in range(reps):
                    page.goto(server.url + "/")
                    wait_js(page, "() => performance.getEntriesByName('board-rendered').length > 0")
                    t = page.evaluate("""() => ({rendered: performance.getEntriesByName('board-rendered')[0].startTime,
                        ttfb: performance.getEntriesByType('navigation')[0].responseStart})""")
                    samples.append(t["rendered"])
                    breakdown["ttfb"].append(t["ttfb"])
                    breakdown["client"].append(t["rendered"] - t["ttfb"])
                return statistics.median(samples)

            page.goto(server.url + "/")  # warm the server (imports, first queries) before measuring
            empty_ms = board_ms()
            settings_update(changes={"max_total": running_n, "interactive_reserve": 1}, partial=True, by=user)
            t0 = time.perf_counter()
            for i in range(running_n):
                origin = "dashboard" if i == 0 else "api"
                # One user seeds the whole board: not subject to the per-user caps (docs/slots.md).
                run = run_submit(
                    owner=user, name=f"running-{i}", origin=origin, kind="rl_train", config={}, user_caps=False
                )
                run_transition(run=run, status=RunStatus.RUNNING)
            for i in range(queued):
                run_submit(
                    owner=user,
                    name=f"queued-{i}",
                    origin=("api", "schedule", "system")[i % 3],
                    kind="rl_train",
                    config={},
                    user_caps=False,
                )
            seed_s = time.perf_counter() - t0
            assert Run.objects.filter(status=RunStatus.QUEUED).count() == queued
            running = list(Run.objects.filter(status=RunStatus.RUNNING).order_by("id"))
            assert len(running) == running_n
            for r in running:  # every running row has gate, version, sampler and a reward history to draw
                em = Emitter(server.url, r.pk, r.ingest_token)
                em.post(em.start() + [e for _ in range(5) for e in em.step_events()])
            full_ms = board_ms()
            split = {k: round(statistics.median(v), 1) for k, v in breakdown.items()}
            counted = page.locator("#waiting-count").inner_text()
            assert counted == str(queued), f"board counts {counted} waiting runs"
            drawn = page.locator("#waiting tbody tr").count()  # the head of the line; more on scroll
            assert drawn >= min(100, queued), f"board drew {drawn} waiting rows"

            # Run page under a 50 events/s stream (10 posts/s of 5 events, as a trainer's batching sink would).
            target = running[0]
            em = Emitter(server.url, target.pk, target.ingest_token)
            em.post(em.start())
            page.goto(f"{server.url}/runs/{target.pk}/")
            wait_js(page, "() => document.querySelector('#conn-state')?.dataset.state === 'live'")
            frame_js = """(ms) => new Promise(done => { const d = []; let last = performance.now();
                const end = last + ms; function tick(t) { d.push(t - last); last = t;
                if (t < end) requestAnimationFrame(tick); else done(d); } requestAnimationFrame(tick); })"""
            idle = page.evaluate(frame_js, stream_s * 1000 / 2)
            stop = threading.Event()
            posted = [0]

            def feed() -> None:
                pending: list = []
                next_t = time.perf_counter()
                while not stop.is_set():
                    while len(pending) < 5:
                        pending.extend(em.step_events())
                    batch, pending[:] = pending[:5], pending[5:]
                    em.post(batch)
                    posted[0] += len(batch)
                    next_t += 0.1
                    time.sleep(max(0.0, next_t - time.perf_counter()))

            feeder = threading.Thread(target=feed, daemon=True)
            feeder.start()
            time.sleep(1.0)  # steady state
            t_stream = time.perf_counter()
            posted_before = posted[0]
            busy = page.evaluate(frame_js, stream_s * 1000)
            rate = (posted[0] - posted_before) / (time.perf_counter() - t_stream)
            stop.set()
            feeder.join(timeout=5)
            target.refresh_from_db()
            shown = "Number(document.querySelector('[data-testid=last-seq]')?.textContent.replace(/,/g, ''))"
            wait_js(page, f"() => {shown} >= {target.last_seq}", timeout=15.0)
            browser.close()

        def p95(values: list[float]) -> float:
            return statistics.quantiles(values, n=20)[-1]

        bundle, uplot_kb = bundle_kb()
        results = {
            "first_render_ms": round(full_ms, 1),
            "bundle_gzip_kb": round(bundle, 1),
            "frame_p95_ms": round(p95(busy), 1),
            "first_render_split_ms": {"server_ttfb": split["ttfb"], "browser": split["client"]},
            "baseline": {
                "empty_board_first_render_ms": round(empty_ms, 1),
                "idle_run_page_frame_p95_ms": round(p95(idle), 1),
                "uplot_alone_gzip_kb": round(uplot_kb, 1),
            },
            "ratios": {
                "first_render_vs_empty": round(full_ms / empty_ms, 2),
                "frame_p95_vs_idle": round(p95(busy) / p95(idle), 2),
                "bundle_vs_uplot": round(bundle / uplot_kb, 2),
            },
            "setup": {
                "queued": queued,
                "running": running_n,
                "events_per_s_measured": round(rate, 1),
                "stream_s": stream_s,
                "frames": len(busy),
                "repetitions": reps,
                "seed_s": round(seed_s, 1),
                "quick": args.quick,
                # Other work on this 2-core machine skews browser timings; recorded to read them by.
                "load_avg_1m_at_end": round(os.getloadavg()[0], 1),
                "cpus": os.cpu_count(),
            },
            "targets": {"first_render_ms": 500, "bundle_gzip_kb": 150, "frame_p95_ms": 50},
        }
    finally:
        server.stop()
        from django.db import connections

        connections.close_all()
        import psycopg

        with psycopg.connect(BASE_DB_URL, autocommit=True) as conn:  # leave no scratch database behind
            conn.execute(f"DROP DATABASE IF EXISTS {SCRATCH_DB} WITH (FORCE)")
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
