"""One process of the slot stress test: random submit / cancel / finish / start / heartbeat loss / settings
changes through the real services, checking the invariants after every step. Prints a JSON summary.

Also the lost-wakeup race: `fill` queues runs behind a few held slots, several `finishers` processes finish held
runs as fast as they can while a `holder` keeps taking the grant lock, then `check` (no tick ran) finds every
freed slot granted.

Usage: DATABASE_URL=... python tests/runs/stress_worker.py setup|work|drain|fill|finishers|holder|check
       [--ops N --seed S --owner ID]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ["CELERY_TASK_ALWAYS_EAGER"] = "1"  # dispatch/stop run inline after commit: no broker in the loop

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

import runs.core.moves  # noqa: E402
import runs.core.publish  # noqa: E402
import runs.core.stores  # noqa: E402
import runs.execution.launch  # noqa: E402

# Browser fan-out is not under test here (tests/realtime covers it); its after-commit reads and Redis round
# trips would dominate each step, so the workers run with publishing switched off.
import runs.scheduling.concurrency  # noqa: E402
import runs.scheduling.enqueue  # noqa: E402

runs.core.publish.run_event_publish = runs.core.publish.dashboard_publish = runs.core.moves.dashboard_publish = (
    runs.core.moves.run_event_publish
) = runs.core.stores.run_event_publish = runs.scheduling.enqueue.dashboard_publish = (
    runs.scheduling.concurrency.dashboard_publish
) = lambda *a, **k: None
# Launched = nothing to do; the run stays `starting` (the launcher itself is tested in tests/runs/test_tasks.py).
runs.execution.launch.launch_run = lambda run_id: "launched"

from django.contrib.auth import get_user_model  # noqa: E402
from django.db import transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

from runs.core.cancel import run_cancel  # noqa: E402
from runs.core.lifecycle import run_finish, run_transition  # noqa: E402
from runs.errors import InvalidInput, InvalidTransition  # noqa: E402
from runs.execution.submit import run_submit  # noqa: E402
from runs.execution.sweeps import runs_reclaim_stale  # noqa: E402
from runs.models import ACTIVE_STATUSES, ClusterNode, Run, RunStatus, Slot, SlotState  # noqa: E402
from runs.scheduling.concurrency import settings_update  # noqa: E402
from tests.runs.helpers import TEST_KIND, register_test_kind  # noqa: E402
from tests.runs.invariants import invariant_violations  # noqa: E402

ORIGINS = ["dashboard", "api", "schedule", "system"]
OPS = ["submit"] * 7 + ["finish"] * 4 + ["cancel"] * 2 + ["start"] * 3 + ["heartbeat_loss"] * 2 + ["settings"] * 2


# STRESS_FAIR=1: runs of several owners, and settings that turn fair share, per-user limits, aging and max wait
# on and off (the crowd of issue 26); the same invariants and drain must hold.
FAIR = os.environ.get("STRESS_FAIR") == "1"


def random_settings(rng: random.Random) -> dict:
    total = rng.randint(1, 6)
    changes: dict = {"max_total": total}
    if rng.random() < 0.5:
        changes["interactive_reserve"] = rng.randint(0, max(0, total - 1))
    if rng.random() < 0.5:
        k = rng.choice(["interactive", "app", "schedule", "system"])
        changes["classes"] = {k: {"limit": rng.randint(1, 6), "priority": rng.randint(0, 100)}}
    if FAIR:
        k = rng.choice(["interactive", "app", "schedule", "system"])
        fair = {"fair_share": rng.choice([True, None]), "max_running_per_user": rng.choice([1, 2, None])}
        fair |= {"aging_per_hour": rng.randint(0, 50), "aging_cap": rng.randint(0, 30)}
        fair["max_wait_seconds"] = rng.choice([1, 60, None])
        changes.setdefault("classes", {}).setdefault(k, {}).update(fair)
        changes["fair_share_half_life_seconds"] = rng.choice([1, 60, 3600])
    return changes


def pick(rng: random.Random, statuses: tuple) -> Run | None:
    ids = list(Run.objects.filter(status__in=statuses).values_list("pk", flat=True)[:200])
    return Run.objects.get(pk=rng.choice(ids)) if ids else None


def step(op: str, rng: random.Random, owner) -> None:
    if op == "submit":
        # One owner submits everything here: the per-user caps (tests/security/test_limits.py) are not under test.
        run_submit(owner=owner, name="s", origin=rng.choice(ORIGINS), kind=TEST_KIND, config={}, user_caps=False)
    elif op == "finish":
        run = pick(rng, ACTIVE_STATUSES)
        if run:
            run_finish(run=run, status=rng.choice([RunStatus.SUCCEEDED, RunStatus.FAILED]))
    elif op == "cancel":
        run = pick(rng, (RunStatus.QUEUED, *ACTIVE_STATUSES))
        if run:
            try:
                run_cancel(run=run, by="stress")
            except InvalidTransition:
                pass  # finished by another process in between
    elif op == "start":
        run = pick(rng, (RunStatus.STARTING,))
        if run:
            try:
                run_transition(run=run, status=RunStatus.RUNNING)
            except InvalidTransition:
                pass
    elif op == "heartbeat_loss":
        run = pick(rng, ACTIVE_STATUSES)
        if run:
            stale = timezone.now() - timedelta(seconds=settings.SLOTS_HEARTBEAT_TIMEOUT_SECONDS + 5)
            Run.objects.filter(pk=run.pk, status__in=ACTIVE_STATUSES).update(heartbeat_at=stale)
        runs_reclaim_stale(now=timezone.now(), jobs={})  # Ray knows no job here
    elif op == "settings":
        try:
            settings_update(changes=random_settings(rng), partial=rng.random() < 0.7, by=None)
        except InvalidInput:
            pass


def setup() -> None:
    """Migrate the (fresh) database and create the submitting user; prints its id."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    # Admission grants only what fits alive ClusterNode capacity: one node large enough for every test run.
    from tests.conftest import TEST_NODE_TOTAL

    ClusterNode.objects.create(node_id="test-node", alive=True, total=TEST_NODE_TOTAL, seen_at=timezone.now())
    print(json.dumps({"owner": get_user_model().objects.create_user("stress").pk}))


def drain() -> None:
    """Finish every active run until nothing waits: each release must grant the next waiting run."""
    rounds = 0
    while Run.objects.filter(status__in=(RunStatus.QUEUED, *ACTIVE_STATUSES)).exists():
        rounds += 1
        if rounds > 10_000:
            print(json.dumps({"ok": False, "problems": ["queue did not drain"]}))
            sys.exit(1)
        active = list(Run.objects.filter(status__in=ACTIVE_STATUSES))
        if not active:
            print(json.dumps({"ok": False, "problems": ["runs wait but nothing is active to free a slot"]}))
            sys.exit(1)
        for run in active:
            run_finish(run=run, status=RunStatus.SUCCEEDED)
            problems = invariant_violations(settled=True)
            if problems:
                print(json.dumps({"ok": False, "problems": problems}))
                sys.exit(1)
    never_granted = Run.objects.filter(granted_at__isnull=True).exclude(status=RunStatus.CANCELLED).count()
    print(
        json.dumps(
            {"ok": never_granted == 0, "rounds": rounds, "runs": Run.objects.count(), "never_granted": never_granted}
        )
    )
    sys.exit(0 if never_granted == 0 else 1)


RACE_SLOTS = 4


def fill(owner_id: int, count: int) -> None:
    """RACE_SLOTS slots, `count` runs submitted: RACE_SLOTS held, the rest waiting."""
    settings_update(changes={"max_total": RACE_SLOTS, "interactive_reserve": 0}, partial=False, by=None)
    owner = get_user_model().objects.get(pk=owner_id)
    for _ in range(count):
        run_submit(owner=owner, name="race", origin="api", kind=TEST_KIND, config={}, user_caps=False)
    print(json.dumps({"ok": True, "held": Slot.objects.filter(state=SlotState.HELD).count()}))


def finishers(ops: int) -> None:
    """Finish held runs as fast as possible: each claims one (SKIP LOCKED) and finishes it in the same
    transaction, so the grant it makes possible runs after that commit (runs.core.lifecycle.run_finish). Counts the
    tries that found the lock taken (`busy`): the race under test."""
    from runs.slots import pg

    busy = 0
    try_lock = pg.pass_begin

    def counted() -> object:
        nonlocal busy
        snapshot = try_lock()
        busy += snapshot is None
        return snapshot

    pg.pass_begin = counted
    done, starved_since = 0, None
    while done < ops:
        with transaction.atomic():
            run_id = (
                Slot.objects.select_for_update(skip_locked=True)
                .filter(state=SlotState.HELD)
                .values_list("run_id", flat=True)
                .first()
            )
            if run_id is None:  # every held run is claimed by another process right now, or none is held
                starved_since = starved_since or time.monotonic()
                if time.monotonic() - starved_since > 10:
                    break  # freed slots were not granted: `check` says so
                continue
            starved_since = None
            run_finish(run=Run(pk=run_id), status=RunStatus.SUCCEEDED)
        done += 1
    print(json.dumps({"ok": True, "finished": done, "busy": busy}))


def holder(until: str) -> None:
    """Until the file `until` exists, take the grant lock again and again, holding it a moment without granting
    (like a cancel of a stopping run or a sweep with nothing to fail): a release that finds the lock taken then
    depends on this holder's catch-up after its commit."""
    from runs.slots import store

    while not os.path.exists(until):
        with transaction.atomic():
            store.slots_lock()
            time.sleep(0.002)
    print(json.dumps({"ok": True}))


def check() -> None:
    """After the finishers (no tick, nothing else running): every slot freed went to a waiting run."""
    waiting = Slot.objects.filter(state=SlotState.WAITING).count()
    held = Slot.objects.filter(state=SlotState.HELD).count()
    problems = invariant_violations(settled=True)
    if waiting and held < RACE_SLOTS:
        problems.append(f"{held} slots held of {RACE_SLOTS} while {waiting} runs wait")
    print(json.dumps({"ok": not problems, "problems": problems, "held": held, "waiting": waiting}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["setup", "work", "drain", "fill", "finishers", "holder", "check"])
    parser.add_argument("--ops", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--owner", type=int, default=0)
    parser.add_argument("--until", default="")
    args = parser.parse_args()
    register_test_kind()
    if args.mode == "setup":
        return setup()
    if args.mode == "drain":
        return drain()
    if args.mode == "fill":
        return fill(args.owner, args.ops)
    if args.mode == "finishers":
        return finishers(args.ops)
    if args.mode == "check":
        return check()
    if args.mode == "holder":
        return holder(args.until)
    rng = random.Random(args.seed)
    owners = [get_user_model().objects.get(pk=args.owner)]
    if FAIR:  # a crowd: every worker submits for the same few owners
        owners += [get_user_model().objects.get_or_create(username=f"crowd-{i}")[0] for i in range(3)]
    counts: dict[str, int] = {}
    for i in range(args.ops):
        op = rng.choice(OPS)
        step(op, rng, rng.choice(owners))
        counts[op] = counts.get(op, 0) + 1
        problems = invariant_violations()
        if problems:
            print(json.dumps({"ok": False, "step": i, "op": op, "problems": problems, "counts": counts}))
            sys.exit(1)
    print(json.dumps({"ok": True, "counts": counts}))


if __name__ == "__main__":
    main()
