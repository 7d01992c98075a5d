"""A crowd: several runs' jobs post their events at once (threads, real commits) and every webhook event is
stored once and delivered once, on PostgreSQL and SQLite (a file test database: SQLITE_TEST_NAME); the
deliveries are then done concurrently too. (tests/webhooks/test_worker.py does the same through a real Celery
worker, PostgreSQL only.) And the API's per-user throttle answers 429."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from rest_framework.test import APIClient

from runs.models import Run
from runs.outbox.models import Effect
from runs.webhooks.models import Delivery, DeliveryState, Subscription
from runs.webhooks.tasks import deliver_once
from tests.webhooks.receiver import payload

RUNS, EVENTS = 4, 5


def checkpoint(seq: int) -> dict:
    return {"seq": seq, "type": "checkpoint", "data": {"state": "saved", "step": seq, "path": f"/c/{seq}"}}


@pytest.mark.django_db(transaction=True)
def test_several_runs_events_at_once_are_delivered_once_each(user, other_user, receiver, private_ok, handed):
    if connection.vendor == "sqlite" and "memory" in str(connection.settings_dict["NAME"]):
        pytest.fail("threads on SQLite need a file test database: set SQLITE_TEST_NAME", pytrace=False)
    owners = [user, other_user]
    for owner in owners:
        Subscription.objects.create(owner=owner, url=receiver.url, events=["run.checkpoint"], secret="c" * 64)
    runs = [
        Run.objects.create(
            name=f"r{i}", origin="api", run_class="app", kind="rl_train", owner=owners[i % 2], status="running"
        )
        for i in range(RUNS)
    ]
    errors: list[str] = []
    start = threading.Barrier(RUNS)

    def post(run: Run) -> None:
        client = APIClient()
        start.wait()
        try:
            for seq in range(1, EVENTS + 1):
                answer = client.post(
                    f"/api/runs/{run.pk}/ingest/",
                    [checkpoint(seq)],
                    format="json",
                    HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
                )
                if answer.status_code != 200:
                    errors.append(answer.content.decode())
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(run,)) for run in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert Delivery.objects.count() == RUNS * EVENTS == len(handed) == len(set(handed))
    assert Effect.objects.filter(kind="webhook", state="done").count() == RUNS * EVENTS

    def deliver(delivery_id: str) -> str:
        try:
            return deliver_once(delivery_id)[0]
        finally:
            connection.close()

    with ThreadPoolExecutor(4) as pool:
        assert set(pool.map(deliver, handed)) == {"delivered"}
    told = [(payload(r)["run"], payload(r)["data"]["step"]) for r in receiver.accepted()]
    assert sorted(told) == sorted((run.pk, seq) for run in runs for seq in range(1, EVENTS + 1))
    assert set(Delivery.objects.values_list("state", flat=True)) == {DeliveryState.DELIVERED}
    # Each subscription was told only of its owner's runs.
    for delivery in Delivery.objects.select_related("subscription", "run"):
        assert delivery.run.owner_id == delivery.subscription.owner_id


@pytest.mark.django_db
def test_the_api_is_throttled_per_user(user, other_user, settings):
    settings.HEAVY_READ_THROTTLE_RATES = {"webhooks": "3/min"}
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "wh-throttle"}
    }
    alice, bob = APIClient(), APIClient()
    alice.force_authenticate(user)
    bob.force_authenticate(other_user)
    assert [alice.get("/api/webhooks/").status_code for _ in range(4)] == [200, 200, 200, 429]
    assert bob.get("/api/webhooks/").status_code == 200
