"""Webhook delivery latency: from an event's commit to its POST arriving at the receiver, as in production.

Path: HTTP ingest POST (per-run token) to a daphne process -> the event and its delivery row + outbox effect
committed in one transaction -> the drainer, kicked after that commit in the web process, sends the delivery
task to Celery (a private redis-server) -> a real Celery worker process resolves and checks the target, signs
and POSTs -> a receiver thread in this process records the arrival. The commit happens inside the ingest POST,
so p50/p95/max are measured from the POST being sent: an upper bound of commit-to-arrival, which also counts
the ingest itself. `answer_to_arrival` (from the POST's answer) is no lower bound: the after-commit kick runs
before the answer is sent, so a delivery can arrive first (negative values). Events are `checkpoint` (state
saved) events of --runs runs, paced at --rate per second in all. Goal: p95 <= 5 s.

Writes bench/results/webhooks.json. Usage: python bench/webhooks.py [--events 200] [--runs 4] [--rate 20]
[--out PATH]; `--smoke --out PATH`: 10 events (checks it runs, in seconds). Database: BENCH_DATABASE_URL
(default bench_webhooks, created and migrated when missing)."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench_db import django_for_bench, percentile  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "webhooks.json"
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/bench_webhooks"


def stats(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 0.5), 1),
        "p95_ms": round(percentile(values, 0.95), 1),
        "max_ms": round(max(values), 1) if values else float("nan"),
    }


def emit(base: str, runs: list, count: int, rate: float, sent: dict, answered: dict) -> None:
    """One checkpoint event per POST, round-robin over the runs, paced on a fixed schedule (no drift)."""
    import requests

    sessions = []
    for run in runs:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {run.ingest_token}"
        sessions.append(session)
    start = time.monotonic()
    for i in range(count):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        run, session = runs[i % len(runs)], sessions[i % len(runs)]
        seq = i // len(runs) + 1
        event = {"seq": seq, "type": "checkpoint", "data": {"state": "saved", "step": seq, "path": f"/c/{seq}"}}
        sent[(run.pk, seq)] = time.time()
        response = session.post(f"{base}/api/runs/{run.pk}/ingest/", json=[event], timeout=30)
        answered[(run.pk, seq)] = time.time()
        response.raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="10 events (needs --out)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--rate", type=float, default=20.0, help="events per second, all runs together")
    args = parser.parse_args()
    if args.smoke and args.out.resolve().parent == RESULTS.parent.resolve():
        parser.error("--smoke needs an --out outside bench/results/ (those files hold real measurements)")
    if args.smoke:
        args.events, args.runs = 10, 2
    command = " ".join(["python", "bench/webhooks.py", *sys.argv[1:]])

    from tests.realtime.servers import CeleryWorker, Daphne, server_env
    from tests.webhooks.receiver import Receiver, payload

    redis = django_for_bench(DEFAULT_DB, "benchwh")
    prefix, db_url = os.environ["CHANNEL_LAYER_PREFIX"], os.environ["DATABASE_URL"]
    from django.contrib.auth import get_user_model

    from runs.models import Run, RunStatus
    from runs.webhooks.models import Subscription

    staff, _ = get_user_model().objects.get_or_create(username="bench-webhooks", defaults={"is_staff": True})
    receiver = Receiver()
    Subscription.objects.filter(owner=staff).delete()
    Subscription.objects.create(
        owner=staff, url=receiver.url, events=["run.checkpoint"], all_runs=True, allow_private=True, secret="b" * 64
    )
    runs = [
        Run.objects.create(
            name=f"bench-wh-{i}", origin="api", run_class="app", kind="rl_train", owner=staff, status=RunStatus.RUNNING
        )
        for i in range(args.runs)
    ]
    env = server_env(database_url=db_url, redis_url=redis.url, prefix=prefix, LOG_LEVEL="WARNING")
    web, worker = Daphne(env), CeleryWorker(env, "bench-webhooks")
    sent: dict = {}
    answered: dict = {}
    try:
        worker.wait_ready()
        emitter = threading.Thread(target=emit, args=(web.http, runs, args.events, args.rate, sent, answered))
        emitter.start()
        emitter.join()
        arrived = receiver.wait_accepted(args.events, timeout=60)
    finally:
        web.close()
        worker.close()
        receiver.close()
        redis.close()
    arrival = {(payload(r)["run"], payload(r)["data"]["step"]): r["at"] for r in arrived}
    keys = [k for k in answered if k in arrival]
    result = {
        "events": args.events,
        "runs": args.runs,
        "rate_per_s": args.rate,
        "delivered": len(keys),
        "lost": args.events - len(keys),
        "duplicates": len(arrived) - len(arrival),
        **stats([(arrival[k] - sent[k]) * 1000 for k in keys]),
        "answer_to_arrival": stats([(arrival[k] - answered[k]) * 1000 for k in keys]),
        "includes": "daphne ingest, PostgreSQL commit, after-commit drain in the web process, Redis broker, "
        "one Celery worker (solo pool), SSRF resolve, HMAC signing, HTTP POST to a local receiver",
        "goal_p95_ms": 5000,
        "command": command,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
