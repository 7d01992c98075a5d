"""Concurrent drainers on PostgreSQL: a row another drainer holds (its claim's transaction, or its database
effect's, which locks the row while it runs) is skipped, not waited for (SELECT ... FOR UPDATE SKIP LOCKED), and
done by whoever holds it or by a later pass."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from runs.outbox.drain import effects_drain
from runs.outbox.effects import Dispatch
from runs.outbox.models import Effect
from runs.outbox.store import effects_store
from tests.runs.pg_fixtures import _needs_postgresql  # noqa: F401 - an autouse fixture

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.django_db(transaction=True)
def test_a_row_another_drainer_holds_is_skipped_not_waited_for(handoffs):
    held, free = Dispatch(run_id=1, at=T0), Dispatch(run_id=2, at=T0)
    with transaction.atomic():
        effects_store([held, free], now=T0)
    locked, release = threading.Event(), threading.Event()

    def other_drainer() -> None:  # its own connection (Django's are per thread)
        try:
            with transaction.atomic():
                Effect.objects.select_for_update().get(key=held.key)
                locked.set()
                release.wait(60)
        finally:
            connection.close()

    thread = threading.Thread(target=other_drainer)
    thread.start()
    try:
        assert locked.wait(30)
        # Waiting for the lock would block until the other drainer ends and then send both: only `free` is done.
        assert effects_drain(now=T0 + timedelta(seconds=1)) == [free.key]
        assert handoffs.dispatched == [2]
    finally:
        release.set()
        thread.join(60)
    assert effects_drain(now=T0 + timedelta(seconds=1)) == [held.key] and handoffs.dispatched == [2, 1]
