"""Deliveries as in production: runs post their events to ingest at once (a crowd of threads), each commit's
outbox effects are drained after it and sent to a real Celery worker (a subprocess on the test database and
Redis), which POSTs them to a receiver that fails each delivery 3 times first. Every delivery is accepted exactly
once, with one delivery id on all of its attempts and a valid signature. PostgreSQL only: the worker reads what
the test commits (tests/processes.py committed_database_url)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from rest_framework.test import APIClient

from runs.models import Run
from runs.webhooks.models import Attempt, Delivery, DeliveryState, Subscription
from tests.processes import committed_database_url
from tests.realtime.servers import CeleryWorker, server_env
from tests.webhooks.receiver import Receiver, payload, signature_valid

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RUNS, EVENTS = 4, 5


def wait_for(check, timeout: float = 30) -> None:
    """The worker records an attempt after the receiver answered it: wait for the record."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not recorded in time"
        time.sleep(0.1)


def checkpoint(seq: int) -> dict:
    return {"seq": seq, "type": "checkpoint", "data": {"state": "saved", "step": seq, "path": f"/c/{seq}"}}


def test_a_crowd_of_runs_is_delivered_exactly_once_through_a_worker(user, staff, redis_url):
    if connection.vendor != "postgresql":
        pytest.skip("the worker process reads the committed test database: PostgreSQL")
    receiver = Receiver(failures=3)
    env = server_env(
        database_url=committed_database_url("the webhook worker test"),
        redis_url=redis_url,
        prefix="wh",
        WEBHOOKS_RETRY_BASE_MS="100",
        WEBHOOKS_RETRY_MAX_S="1",
    )
    worker = CeleryWorker(env, "webhooks")
    try:
        worker.wait_ready()
        sub = Subscription.objects.create(
            owner=staff, url=receiver.url, events=["run.checkpoint"], all_runs=True, allow_private=True, secret="z" * 64
        )
        runs = [
            Run.objects.create(
                name=f"r{i}", origin="api", run_class="app", kind="rl_train", owner=user, status="running"
            )
            for i in range(RUNS)
        ]
        errors: list[str] = []

        def post(run: Run) -> None:
            client = APIClient()
            for seq in range(1, EVENTS + 1):
                answer = client.post(
                    f"/api/runs/{run.pk}/ingest/",
                    [checkpoint(seq)],
                    format="json",
                    HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
                )
                if answer.status_code != 200:
                    errors.append(answer.content.decode())
            connection.close()

        threads = [threading.Thread(target=post, args=(run,)) for run in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        accepted = receiver.wait_accepted(RUNS * EVENTS, timeout=120)
        assert len(accepted) == RUNS * EVENTS, worker.log.read_text()[-3000:]
        ids = [r["headers"]["X-RLCP-Delivery"] for r in accepted]
        assert len(set(ids)) == RUNS * EVENTS  # each delivery accepted once
        assert all(receiver.tries[i] == 4 for i in ids)  # 3 failures, then the accepted one
        assert all(signature_valid(r, sub.secret) for r in receiver.requests)
        told = {(payload(r)["run"], payload(r)["data"]["step"]) for r in accepted}
        assert told == {(run.pk, seq) for run in runs for seq in range(1, EVENTS + 1)}
        wait_for(lambda: set(Delivery.objects.values_list("state", flat=True)) == {DeliveryState.DELIVERED})
        assert Attempt.objects.count() == 4 * RUNS * EVENTS
    finally:
        worker.close()
        receiver.close()
