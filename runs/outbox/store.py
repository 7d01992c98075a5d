"""Storing effects in the transaction of the move that implies them, and the kick after its commit.

`effects_store` writes the rows with the ORM in the current transaction, and refuses to run outside one: an
effect written after its move committed is what the outbox exists to avoid. On PostgreSQL the fast path writes
a move in one statement that may commit on its own (runs/slots/pg.py); that statement stores the same rows from
the same parameters (`effects_params`) in a data-modifying CTE (`insert_cte`), written only if the move is.

`effects_kick` has the effects done right after the commit, in this process (runs/outbox/drain.py: a database
effect runs here, a worker's is sent to Celery). Only latency depends on it: whatever a crash or an error
leaves pending, the tick drains.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime

from django.db import connection, transaction

from runs.outbox.drain import effects_drain
from runs.outbox.effects import RunEffect
from runs.outbox.models import Effect, EffectState


def effects_store(effects: Sequence[RunEffect], *, now: datetime) -> None:
    """Store the effects of a move as pending rows, due at `now`, in the move's transaction (the current one).
    A key stored already keeps its row: storing the same effect twice is one effect."""
    if not effects:
        return
    if not connection.in_atomic_block:
        raise RuntimeError("effects are stored in the transaction of the move that implies them")
    Effect.objects.bulk_create(
        [Effect(kind=e.kind, key=e.key, payload=e.payload(), next_attempt_at=now, created_at=now) for e in effects],
        ignore_conflicts=True,
    )


def effects_params(effects: Sequence[RunEffect]) -> dict[str, list[str]]:
    """The parameters of `insert_cte`: the rows effects_store writes, column by column."""
    return {
        "fx_kind": [e.kind for e in effects],
        "fx_key": [e.key for e in effects],
        "fx_payload": [json.dumps(e.payload()) for e in effects],
    }


def insert_cte(when: str) -> str:
    """`fx AS (INSERT ...)`: the rows of `effects_params` (due at the statement's `%(now)s`), written when the
    SQL condition `when` holds (the statement's move was written). Empty arrays write nothing."""
    table, pending = Effect._meta.db_table, EffectState.PENDING.value
    return (
        f"fx AS (INSERT INTO {table} "
        "(kind, key, payload, state, attempts, next_attempt_at, claim, last_error, outcome, created_at)\n"
        f"      SELECT f.kind, f.key, f.payload::jsonb, '{pending}', 0, %(now)s, '', '', '', %(now)s\n"
        "      FROM unnest(%(fx_kind)s::text[], %(fx_key)s::text[], %(fx_payload)s::text[]) AS f(kind, key, payload)\n"
        f"      WHERE {when} ON CONFLICT (key) DO NOTHING RETURNING 1)"
    )


def effects_kick(effects: Sequence[RunEffect]) -> None:
    """Drain these effects once the current transaction commits (at once outside one), here; an error there is
    logged (the move is committed and must not look failed) and the tick drains them."""
    if effects:
        transaction.on_commit(functools.partial(_kicked, [e.key for e in effects]), robust=True)


def _kicked(keys: list[str]) -> None:
    effects_drain(keys=keys)
