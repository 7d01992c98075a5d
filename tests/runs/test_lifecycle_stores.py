"""The transition rules live in runs.core.lifecycle; both stores (the ORM and PostgreSQL's SQL fast path) take them
as parameters. For every (from, to) pair each store writes exactly the moves the table allows, with the same
columns, event and effects (the outbox's rows: written with an allowed move, never with a refused one)."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from runs.core import lifecycle
from runs.core.stores import ORM_STORE, PG_STORE
from runs.models import FINISHED_STATUSES, Run, RunEvent, RunStatus, Slot, SlotState
from runs.outbox.models import Effect
from runs.slots import pg
from runs.slots.grant import Decision

pytestmark = pytest.mark.django_db

STATES = lifecycle.STATES
FIELDS = (
    "status",
    "error",
    "granted_at",
    "started_at",
    "finished_at",
    "heartbeat_at",
    "last_seq",
    "pending_reason",
    "pending_detail",
)


@pytest.fixture(autouse=True)
def _needs_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.fail("compares the PostgreSQL path: run it with a postgres DATABASE_URL", pytrace=False)


def _run_in(user, status: str, slot: str, then) -> Run:
    run = Run.objects.create(
        name="r",
        origin="api",
        run_class="app",
        kind="test_job",
        owner=user,
        status=status,
        granted_at=then,
        started_at=then,
        heartbeat_at=then,
        pending_reason="waiting_for_resources",
        pending_detail="PACK group pending",
    )
    Slot.objects.create(
        run_id=run.pk,
        run_class="app",
        state=slot,
        requested_at=then,
        granted_at=then if slot == SlotState.HELD else None,
    )
    return run


def _outcome(run_id: int) -> tuple:
    row = Run.objects.values(*FIELDS).get(pk=run_id)
    event = RunEvent.objects.filter(run_id=run_id, type="status").values("seq", "data").first()
    return tuple(row[f] for f in FIELDS), event, Slot.objects.filter(run_id=run_id).exists()


def _effects(run_id: int) -> list[tuple]:
    """The run's stored effects, its id left out (each store moves a run of its own)."""
    return [
        (e.kind, e.key.split(":", 2)[::2], {**e.payload, "run": 0}, e.state, e.attempts)
        + (e.next_attempt_at, e.created_at, e.claim, e.outcome)
        for e in Effect.objects.filter(payload__run=run_id).order_by("kind")
    ]


@pytest.mark.parametrize("previous,status", list(itertools.product(STATES, FINISHED_STATUSES)))
def test_finish_moves_agree(user, previous, status):
    results = []
    now = timezone.now()
    for store in (ORM_STORE, PG_STORE):
        with transaction.atomic():
            run = _run_in(user, previous, SlotState.HELD, now - timedelta(minutes=5))
            finished, _ = store.finish(
                run_id=run.pk,
                status=status,
                error="e",
                now=now,
                allowed=lifecycle.allowed_from(status),
                columns=lifecycle.stamp(status, now),
                effects=lifecycle.finish_effects(run, status, now, stop_job=True),
            )
            assert (finished is not None) == lifecycle.move_allowed(previous, status), (store, previous, status)
            values, event, slot = _outcome(run.pk)
            effects = _effects(run.pk)
            assert bool(effects) == (finished is not None), (store, previous, status, effects)
            results.append((finished is not None, values, event and event["data"], slot, effects))
            if finished is not None:  # a finished run waits for nothing
                assert values[FIELDS.index("pending_reason")] == values[FIELDS.index("pending_detail")] == ""
            transaction.set_rollback(True)
    assert results[0] == results[1]


@pytest.mark.parametrize("previous", STATES)
def test_grant_moves_agree(user, previous):
    status = RunStatus.STARTING
    allowed = lifecycle.move_allowed(previous, status)
    for store in (ORM_STORE, PG_STORE):
        with transaction.atomic():
            now = timezone.now()
            run = _run_in(user, previous, SlotState.WAITING, now - timedelta(minutes=5))
            refused = None
            try:
                if store is PG_STORE:
                    pg.grants_apply(
                        decisions=[Decision(run.pk, "app", now)],
                        now=now,
                        source="platform",
                        status=status,
                        allowed_from=lifecycle.allowed_from(status),
                        columns=lifecycle.stamp(status, now),
                        effects=lifecycle.granted_effects([run.pk], now),
                    )
                else:
                    lifecycle.run_status_change(
                        run=Run.objects.select_for_update().get(pk=run.pk), status=status, now=now
                    )
            except Exception as exc:  # noqa: BLE001 - the refusal is what is compared
                refused = exc
            assert (refused is None) == allowed, (store, previous, refused)
            if allowed:
                run.refresh_from_db()
                assert (run.status, run.granted_at, run.started_at, run.heartbeat_at) == (status, now, None, None)
            if store is PG_STORE:  # its launch is stored with the grant, and only with it
                assert [e[0] for e in _effects(run.pk)] == (["dispatch"] if allowed else [])
            transaction.set_rollback(True)
