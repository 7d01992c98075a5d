"""Slot invariants checked by the stress tests, each read from one committed state."""

from __future__ import annotations

import time

from django.db import connection, transaction
from django.utils import timezone

from runs.models import ACTIVE_STATUSES, FINISHED_STATUSES, ConcurrencySettings, Run
from runs.slots import store
from runs.slots.grant import INTERACTIVE, grant
from runs.slots.policy import CLASSES

OTHERS = [k for k in CLASSES if k != INTERACTIVE]
CONSISTENCY_MESSAGES = (
    "a finished run still has a slot",
    "an active run holds no slot",
    "a queued run has no waiting slot",
    "a held slot belongs to a run that is not active",
)
FINISHED_SQL = "(" + ", ".join(f"'{x}'" for x in FINISHED_STATUSES) + ")"  # constants, not input
ACTIVE_SQL = "(" + ", ".join(f"'{x}'" for x in ACTIVE_STATUSES) + ")"
CONSISTENCY_SQL = f"""
SELECT
  EXISTS (SELECT 1 FROM runs_slot s JOIN runs_run r ON r.id = s.run_id WHERE r.status IN {FINISHED_SQL}),
  EXISTS (SELECT 1 FROM runs_run r LEFT JOIN runs_slot s ON s.run_id = r.id
          WHERE r.status IN {ACTIVE_SQL} AND (s.state IS NULL OR s.state <> 'held')),
  EXISTS (SELECT 1 FROM runs_run r LEFT JOIN runs_slot s ON s.run_id = r.id
          WHERE r.status = 'queued' AND (s.state IS NULL OR s.state <> 'waiting')),
  EXISTS (SELECT 1 FROM runs_slot s JOIN runs_run r ON r.id = s.run_id
          WHERE s.state = 'held' AND r.status NOT IN {ACTIVE_SQL})
"""


# On PostgreSQL a release commits before the grant it makes possible (runs.core.lifecycle.grants_catch_up), so
# another process may see a run grantable for a moment; left waiting this long, it was forgotten.
GRANTABLE_GRACE_SECONDS = 3.0


def invariant_violations(*, settled: bool = False) -> list[str]:
    """Limits hold for every grant made under the current settings (lowering a limit never preempts, so runs
    granted earlier may exceed it); slots and statuses agree (both read from one committed state); no waiting run
    stays grantable: `settled` (no other process is working, the last release returned) means right now, else
    for GRANTABLE_GRACE_SECONDS (SQLite: grants commit with releases, always right now)."""
    problems, grantable = _violations()
    deadline = time.monotonic() + GRANTABLE_GRACE_SECONDS
    while grantable and not settled and connection.vendor == "postgresql" and time.monotonic() < deadline:
        time.sleep(0.05)
        grantable &= _violations()[1]  # still grantable, still the same runs: none of them granted meanwhile
    if grantable:
        problems.append(f"runs {sorted(grantable)} are grantable but left waiting")
        problems.append(_diagnosis(grantable))
    return problems


def _diagnosis(grantable: set[int]) -> str:
    """What a failure report needs to tell a lost wakeup from a loader or order mismatch: the policy, the held
    counts per class and owner, the grantable runs' slots, and what the PostgreSQL grant path decides now."""
    from runs.models import Slot

    policy = store.policy_load(fresh=True)
    snapshot = store.snapshot_load(policy)
    slots = list(Slot.objects.filter(run_id__in=grantable).values("run_id", "run_class", "owner_id", "state"))
    seen = {"policy": {"max_total": policy.max_total, "borrowable": policy.borrowable}}
    seen["classes"] = {k: (policy.classes[k].limit, policy.fairness.of(k).to_dict()) for k in CLASSES}
    seen |= {"held": snapshot.held, "by_owner": {f"{k}:{o}": n for (k, o), n in snapshot.held_by_owner().items()}}
    seen["slots"] = slots
    if connection.vendor == "postgresql":
        from runs.core.stores import PG_STORE, _decide
        from runs.slots import pg

        seen["pg_decides"] = [d.run_id for d in _decide(pg.snapshot_fetch(window=0), timezone.now())]
        seen["pg_pending"] = PG_STORE.grant_pending()
    return f"diagnosis: {seen}"


def _violations() -> tuple[list[str], set[int]]:
    """One committed state's problems, and the runs a grant pass would grant now."""
    problems: list[str] = []
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # A consistent snapshot without taking the grant lock: every committed state must satisfy the
            # invariants, and checkers then do not serialize with the operations they check.
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        else:
            store.slots_lock()  # SQLite: BEGIN IMMEDIATE already holds the write lock; a consistent view
        policy = store.policy_load(fresh=True)
        changed_at = ConcurrencySettings.objects.order_by("pk").values_list("updated_at", flat=True).first()
        held = store.held_counts()

        recent = Run.objects.filter(granted_at__isnull=False)
        recent = recent.filter(granted_at__gt=changed_at) if changed_at else recent
        granted_classes = set(recent.values_list("run_class", flat=True).distinct())

        def granted_since(classes: list[str]) -> bool:
            return bool(granted_classes.intersection(classes))

        for k in CLASSES:
            if held[k] > policy.classes[k].limit and granted_since([k]):
                problems.append(f"class {k} holds {held[k]} > limit {policy.classes[k].limit}")
        if sum(held.values()) > policy.max_total and granted_since(list(CLASSES)):
            problems.append(f"total held {sum(held.values())} > max_total {policy.max_total}")
        others = sum(held[k] for k in OTHERS)
        if others > policy.borrowable and granted_since(OTHERS):
            problems.append(f"non-interactive held {others} > max_total - reserve {policy.borrowable}")
        with connection.cursor() as cursor:  # four consistency checks in one round trip
            cursor.execute(CONSISTENCY_SQL)
            flags = cursor.fetchone()
        problems += [message for message, bad in zip(CONSISTENCY_MESSAGES, flags) if bad]
        grantable = {d.run_id for d in grant(store.snapshot_load(policy), timezone.now())}
    return problems, grantable
