"""Ingest under the run row lock (runs/telemetry/ingest.py): a batch whose attempt is replaced while it waits for the
lock answers 409 and stores nothing; the new attempt's batch lands. Real PostgreSQL, two threads racing."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction
from rest_framework.test import APIClient

from runs.models import Run, RunEvent
from tests.realtime.conftest import run_make, train, user_make

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _needs_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.fail("test_ingest_race.py needs row locks: run it with a postgres DATABASE_URL", pytrace=False)


def post(run_id: int, token: str, body):
    return APIClient().post(f"/api/runs/{run_id}/ingest/", body, format="json", HTTP_AUTHORIZATION=f"Bearer {token}")


def waiting_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # inside a transaction the view is otherwise frozen
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return cursor.fetchone()[0] > 0


def test_a_batch_of_an_attempt_replaced_while_it_waits_for_the_lock_is_a_409_and_stores_nothing():
    run = run_make(user_make("racer"))
    old_token = run.ingest_token
    answers: dict[str, object] = {}

    def old_job() -> None:
        try:
            answers["old"] = post(run.pk, old_token, [train(1, step=1), train(2, step=2)])
        finally:
            connections.close_all()

    with transaction.atomic():
        # A requeue or resume of the run holds its row lock: the old job's post passes the token check (attempt 0
        # is still current when it reads), then waits for the lock.
        locked = Run.objects.select_for_update().get(pk=run.pk)
        thread = threading.Thread(target=old_job)
        thread.start()
        deadline = time.monotonic() + 20
        while not waiting_for_a_lock():
            assert time.monotonic() < deadline, "the old attempt's post never reached the row lock"
            assert thread.is_alive(), answers
            time.sleep(0.05)
        locked.attempt += 1  # the new attempt (what run_requeue and resume do under this lock)
        locked.save(update_fields=["attempt"])
    thread.join(30)

    response = answers["old"]
    assert response.status_code == 409, response.content
    assert response.json()["field"] == "attempt"
    assert "attempt 0" in response.json()["detail"] and "replaced by attempt 1" in response.json()["detail"]
    assert not RunEvent.objects.filter(run_id=run.pk).exists()
    assert Run.objects.get(pk=run.pk).last_seq == 0

    # The new attempt's job posts with its own token and lands; the old token is refused at once now.
    new = Run.objects.get(pk=run.pk)
    assert post(run.pk, new.ingest_token, [train(1, step=1)]).json()["stored"] == 1
    assert post(run.pk, old_token, [train(3, step=3)]).status_code == 401
    assert list(RunEvent.objects.filter(run_id=run.pk).values_list("source", flat=True)) == ["attempt-1"]


def test_two_attempts_posting_at_once_store_only_the_current_ones_events():
    """Both jobs post many batches at the same time while the attempt moves on: every batch of attempt 0 that was
    stored was stored before the move; after it, only attempt 1's land."""
    run = run_make(user_make("racer2"))
    tokens = {0: run.ingest_token}
    codes: dict[int, list[int]] = {0: [], 1: []}
    moved = threading.Event()

    def job(attempt: int) -> None:
        try:
            if attempt == 1:
                moved.wait(30)
            for seq in range(1, 41):
                codes[attempt].append(post(run.pk, tokens[attempt], [train(seq, step=seq)]).status_code)
        finally:
            connections.close_all()

    old = threading.Thread(target=job, args=(0,))
    old.start()
    while len(codes[0]) < 5:
        time.sleep(0.01)
    Run.objects.filter(pk=run.pk).update(attempt=1)
    tokens[1] = Run.objects.get(pk=run.pk).ingest_token
    moved.set()
    new = threading.Thread(target=job, args=(1,))
    new.start()
    old.join(120)
    new.join(120)

    assert codes[1] == [200] * 40
    first_refused = next(i for i, code in enumerate(codes[0]) if code != 200)
    assert set(codes[0][first_refused:]) <= {401, 409}  # refused before the lock (401) or under it (409)
    stored = list(RunEvent.objects.filter(run_id=run.pk, source="attempt-0").values_list("source_seq", flat=True))
    assert sorted(stored) == list(range(1, first_refused + 1))
    assert RunEvent.objects.filter(run_id=run.pk, source="attempt-1").count() == 40
