"""The drainer: does pending effects, each exactly once, right after the commit that stored them (the kick,
runs/outbox/store.py) and from the tick (whatever a crash or an error left).

A pass claims due rows (pending, `next_attempt_at` passed; after a kick only that commit's keys) in a short
transaction of its own: SELECT ... FOR UPDATE SKIP LOCKED on PostgreSQL, so that concurrent drainers take
disjoint rows; on SQLite, which has one writer, the transaction alone serializes them. The claim stamps the
pass's token on each row, counts the attempt and moves `next_attempt_at` one lease ahead: rows held by a drainer
that died are claimed again once the lease has passed. Then each row, by its kind (runs/outbox/effects.py):

- run here (a database write: the follow-ups): one transaction locks the row, checks that this pass still holds
  it, runs the task's body and marks the row done. A crash anywhere in it rolls all of it back: done once.
- sent (a worker's: launch, stop): the task is sent to Celery, then the row marked done if this pass still
  holds it. A crash between the two sends it again after the lease; those tasks are idempotent (a launch finds
  its attempt's Ray job by submission id, a stop of a stopped job does nothing), so the effect happens once.

A task that refuses (ServiceError: the run moved on, nothing is left to do) is done, the refusal its outcome.
Any other error is retried after 1 s, doubling up to RETRY_MAX_SECONDS, and given up (`failed`, logged as an
error) after MAX_ATTEMPTS attempts, about an hour; so is a row claimed that often without an end (its task kills
the process). A kind this code does not know is never claimed (a newer process's row waits for one that does).
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from runs.errors import ServiceError
from runs.outbox.effects import KINDS, effect_load
from runs.outbox.models import Effect, EffectState

logger = logging.getLogger(__name__)

LEASE_SECONDS = 60  # a claim's hold on its rows: far longer than any task takes to send or to run here
RETRY_MAX_SECONDS = 300
MAX_ATTEMPTS = 20
BATCH = 50  # rows per claim

_discovery_lock = threading.Lock()


def task_named(name: str) -> Any:
    """A Celery task by name. A process that is not a worker (web, scripts) has not yet run the autodiscovery a
    worker runs at start-up; the first lookup runs it (once: concurrent first lookups wait for it)."""
    if name not in current_app.tasks:
        with _discovery_lock:
            if name not in current_app.tasks:
                current_app.loader.import_default_modules()
    return current_app.tasks[name]


@dataclass(frozen=True)
class Claimed:
    id: int
    key: str
    kind: str
    payload: Any
    attempts: int  # this claim included


def effects_drain(*, keys: Sequence[str] | None = None, now: datetime | None = None, limit: int = 1000) -> list[str]:
    """Do the due effects (only those of `keys` when given), a batch per claim, at most `limit` claims in all.
    `now`: the clock the due times and leases are read against (the current time when not given). Returns the
    keys this call finished (done or given up), in order."""
    finished: list[str] = []
    claimed_so_far = 0
    while claimed_so_far < limit:
        at = now or timezone.now()
        token = secrets.token_hex(8)
        claimed = _claim(token, keys=keys, now=at, n=min(BATCH, limit - claimed_so_far))
        if not claimed:
            break
        claimed_so_far += len(claimed)
        finished += [row.key for row in claimed if _do(row, token, now=at)]
    return finished


def _claim(token: str, *, keys: Sequence[str] | None, now: datetime, n: int) -> list[Claimed]:
    with transaction.atomic():
        due = Effect.objects.select_for_update(skip_locked=True).filter(
            state=EffectState.PENDING, next_attempt_at__lte=now, kind__in=list(KINDS)
        )
        if keys is not None:
            due = due.filter(key__in=list(keys))
        rows = list(due.order_by("id").values_list("id", "key", "kind", "payload", "attempts")[:n])
        if rows:
            Effect.objects.filter(id__in=[r[0] for r in rows]).update(
                claim=token, attempts=F("attempts") + 1, next_attempt_at=now + timedelta(seconds=LEASE_SECONDS)
            )
    return [Claimed(id=i, key=k, kind=kind, payload=p, attempts=a + 1) for i, k, kind, p, a in rows]


def _do(row: Claimed, token: str, *, now: datetime) -> bool:
    """Do one claimed row; True when it is finished (done or given up) by this pass."""
    try:
        effect = effect_load(row.kind, row.payload)
    except ValueError as exc:
        logger.error("effect %s: given up: %s", row.key, exc)
        return _finish(row, token, EffectState.FAILED, error=f"cannot be done: {exc}")
    if row.attempts > MAX_ATTEMPTS:
        logger.error("effect %s: given up: claimed %s times without an end", row.key, row.attempts)
        return _finish(row, token, EffectState.FAILED, error=f"claimed {row.attempts} times without an end")
    try:
        task = task_named(effect.task)
        if effect.here:
            with transaction.atomic():
                if not _lock_mine(row, token):
                    return False  # this claim's lease ran out and another pass holds the row now
                outcome = task.run(*effect.args())
                return _finish(row, token, EffectState.DONE, outcome=str(outcome))
        task.delay(*effect.args())
    except ServiceError as exc:
        logger.warning("effect %s: refused: %s", row.key, exc)
        return _finish(row, token, EffectState.DONE, outcome=f"refused: {exc}")
    except Exception as exc:  # noqa: BLE001 - recorded on the row and retried
        return _retry(row, token, exc, now=now)
    return _finish(row, token, EffectState.DONE, outcome="sent")


def _lock_mine(row: Claimed, token: str) -> bool:
    return Effect.objects.select_for_update().filter(pk=row.id, claim=token, state=EffectState.PENDING).exists()


def _finish(row: Claimed, token: str, state: str, *, outcome: str = "", error: str = "") -> bool:
    """Mark the row done or failed, if this pass still holds it (else another one does: it is theirs)."""
    fields: dict[str, Any] = {"state": state, "done_at": timezone.now(), "claim": "", "outcome": outcome[:200]}
    if error:
        fields["last_error"] = error
    marked = Effect.objects.filter(pk=row.id, claim=token, state=EffectState.PENDING).update(**fields)
    if not marked:
        logger.warning("effect %s: its claim ran out before it was marked %s; another pass holds it", row.key, state)
    return bool(marked)


def _retry(row: Claimed, token: str, exc: Exception, *, now: datetime) -> bool:
    error = f"{type(exc).__name__}: {exc}"[:2000]
    if row.attempts >= MAX_ATTEMPTS:
        logger.error("effect %s: given up after %s attempts: %s", row.key, row.attempts, error)
        return _finish(row, token, EffectState.FAILED, error=error)
    delay = min(2 ** (row.attempts - 1), RETRY_MAX_SECONDS)
    logger.warning("effect %s: attempt %s failed, again in %s s: %s", row.key, row.attempts, delay, error)
    Effect.objects.filter(pk=row.id, claim=token, state=EffectState.PENDING).update(
        claim="", next_attempt_at=now + timedelta(seconds=delay), last_error=error
    )
    return False
