"""What is told: a run's job events (checkpoint saved, gate poisoned, evaluation) and status moves, each stored as
a delivery with its outbox effect in the event's transaction, only to the subscriptions whose scope covers the
run; metric rules fire within the batch that crosses them, once, and re-arm when uncrossed. Deliveries are done
here attempt by attempt (`deliver_once`); tests/webhooks/test_worker.py does them through a Celery worker."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from runs.core.lifecycle import run_finish, run_status_change
from runs.execution.submit import run_submit
from runs.models import Run, RunStatus
from runs.outbox.models import Effect
from runs.webhooks.models import Delivery, DeliveryState, MetricRule, Subscription
from runs.webhooks.rules import rule_step
from runs.webhooks.tasks import deliver_once
from tests.runs.helpers import TEST_JOB_KIND
from tests.webhooks.receiver import Receiver, payload, signature_valid

pytestmark = pytest.mark.django_db


def run_of(owner, status: str = RunStatus.RUNNING) -> Run:
    return Run.objects.create(name="r", origin="api", run_class="app", kind="rl_train", owner=owner, status=status)


def subscribe(owner, url: str, events: list[str], **fields) -> Subscription:
    return Subscription.objects.create(owner=owner, url=url, events=events, secret="k" * 64, **fields)


def ingest(run: Run, events: list[dict]):
    client = APIClient()
    answer = client.post(
        f"/api/runs/{run.pk}/ingest/", events, format="json", HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}"
    )
    assert answer.status_code == 200, answer.content
    return answer


def train(seq: int, exact_match: float, reward: float = 0.0) -> dict:
    data = {"step": seq, "loss": 0.5, "reward_mean": reward, "exact_match": exact_match, "kl": 0.0}
    return {"seq": seq, "type": "train", "data": {**data, "entropy": 1.0, "staleness_max": 0}}


def test_a_receiver_failing_three_times_gets_one_accepted_delivery(user, private_ok, handed, capture):
    receiver = Receiver(failures=3)
    try:
        sub = subscribe(user, receiver.url, ["run.checkpoint"])
        run = run_of(user)
        with capture(execute=True):
            ingest(run, [{"seq": 1, "type": "checkpoint", "data": {"state": "saved", "step": 3, "path": "/c/3"}}])
        [delivery_id] = handed
        outcomes = [deliver_once(delivery_id)[0] for _ in range(5)]
        assert outcomes == ["retry", "retry", "retry", "delivered", "skipped"]
        assert [r["status"] for r in receiver.requests] == [500, 500, 500, 204]
        assert {r["headers"]["X-RLCP-Delivery"] for r in receiver.requests} == {delivery_id}
        assert all(signature_valid(r, sub.secret) for r in receiver.requests)
        body = payload(receiver.accepted()[0])
        assert body["event"] == "run.checkpoint" and body["run"] == run.pk and body["data"]["step"] == 3
        assert body["delivery_id"] == delivery_id and set(body) == {"delivery_id", "event", "run", "at", "data"}
        delivery = Delivery.objects.get(pk=delivery_id)
        assert delivery.state == DeliveryState.DELIVERED and delivery.attempts == 4
        assert [a.status_code for a in delivery.attempt_log.all()] == [500, 500, 500, 204]
    finally:
        receiver.close()


def test_deliveries_give_up_after_max_attempts(user, private_ok, handed, settings):
    settings.WEBHOOKS_MAX_ATTEMPTS = 2
    receiver = Receiver(failures=99)
    try:
        sub = subscribe(user, receiver.url, ["run.status"])
        delivery = Delivery.objects.create(subscription=sub, event="test", at=timezone.now())
        assert [deliver_once(str(delivery.pk))[0] for _ in range(3)] == ["retry", "failed", "skipped"]
        assert len(receiver.requests) == 2
    finally:
        receiver.close()


def test_job_events_are_told_in_their_transaction_to_the_covered_scopes(
    user, other_user, staff, receiver, private_ok, handed, capture
):
    run, others = run_of(user), run_of(other_user)
    mine_all = subscribe(user, receiver.url, ["run.gate_poisoned", "run.evaluation"])
    mine_one = subscribe(user, receiver.url, ["run.gate_poisoned"], run=run)
    subscribe(user, receiver.url, ["run.gate_poisoned"], run=others)  # not possible by the API; scope still holds
    subscribe(other_user, receiver.url, ["run.gate_poisoned"])
    everything = subscribe(staff, receiver.url, ["run.gate_poisoned"], all_runs=True)
    subscribe(staff, receiver.url, ["run.gate_poisoned"])  # staff's own runs only: none
    gate = {"state": "poisoned", "version": 2, "active": 0, "waiting": 0, "engines": []}
    with capture(execute=True):
        ingest(
            run,
            [{"seq": 1, "type": "gate", "data": gate}, {"seq": 2, "type": "gate", "data": {**gate, "state": "open"}}],
        )
        ingest(run, [{"seq": 3, "type": "log", "data": {"level": "info", "eval": {"exact_match": 0.5}}}])
    told = Delivery.objects.filter(run=run)
    assert sorted((d.subscription_id, d.event) for d in told) == sorted(
        [
            (mine_all.pk, "run.gate_poisoned"),
            (mine_one.pk, "run.gate_poisoned"),
            (everything.pk, "run.gate_poisoned"),
            (mine_all.pk, "run.evaluation"),
        ]
    )
    assert Effect.objects.filter(kind="webhook").count() == 4 and len(handed) == 4
    assert sorted(handed) == sorted(str(d.pk) for d in told)


@pytest.mark.django_db(transaction=True)  # grants and finishes on PostgreSQL commit on their own
def test_a_grant_is_told_through_its_stored_effect(
    user, other_user, receiver, private_ok, handed, handoffs, settings, tmp_path
):
    settings.RUN_ARTIFACTS_DIR = str(tmp_path)
    sub = subscribe(user, receiver.url, ["run.status"])
    subscribe(other_user, receiver.url, ["run.status"])  # not told of alice's run
    run = run_submit(owner=user, name="r", origin="api", kind=TEST_JOB_KIND, config={})
    assert Run.objects.get(pk=run.pk).status == RunStatus.STARTING and handoffs.dispatched == [run.pk]
    told = [(d.subscription_id, d.data["status"], d.data["previous"]) for d in Delivery.objects.all()]
    assert told == [(sub.pk, "starting", "queued")] and len(handed) == 1
    assert Effect.objects.filter(kind="hookstatus", state="done").count() == 1


@pytest.mark.django_db(transaction=True)  # a finish on PostgreSQL commits on its own: real commits here
def test_status_moves_and_finishes_are_told(user, receiver, private_ok, handed):
    sub = subscribe(user, receiver.url, ["run.status"])
    run = run_of(user, status=RunStatus.RUNNING)
    with transaction.atomic():
        run_status_change(run=Run.objects.select_for_update().get(pk=run.pk), status=RunStatus.STOPPING)
    run_finish(run=Run.objects.get(pk=run.pk), status=RunStatus.CANCELLED, error="by test")
    states = [(d.data["status"], d.data["previous"]) for d in Delivery.objects.filter(subscription=sub).order_by("at")]
    assert states == [("stopping", "running"), ("cancelled", "stopping")]
    assert len(handed) == 2


def test_a_threshold_rule_fires_in_the_crossing_batch_once_and_rearms(user, receiver, private_ok, handed, capture):
    sub = subscribe(user, receiver.url, ["run.status"])  # rules fire whatever the events list says
    MetricRule.objects.create(subscription=sub, metric="exact_match", op="above", threshold=0.5)
    run = run_of(user)
    with capture(execute=True):
        ingest(run, [train(1, 0.1), train(2, 0.4)])
    assert handed == []
    with capture(execute=True):
        ingest(run, [train(3, 0.45), train(4, 0.6), train(5, 0.7)])  # crosses at seq 4: told by this batch
    with capture(execute=True):
        ingest(run, [train(6, 0.8), train(7, 0.9)])  # still crossed: not again
    alerts = list(Delivery.objects.filter(event="metric.alert"))
    assert len(alerts) == 1 and alerts[0].data["value"] == 0.6 and alerts[0].data["seq"] == 4
    with capture(execute=True):
        ingest(run, [train(8, 0.2), train(9, 0.55)])  # uncrossed, then crossed again: fires again
    assert Delivery.objects.filter(event="metric.alert").count() == 2
    assert len(handed) == 2


def test_rule_steps():
    assert rule_step("below", 0.3, 0, [], 0.2) == (True, [])
    assert rule_step("above", 0.3, 0, [], 0.3) == (False, [])
    crossed, kept = rule_step("drop", 0.5, 3, [1.0, 0.9], 0.4)
    assert crossed and kept == [1.0, 0.9, 0.4]
    assert rule_step("drop", 0.5, 3, [1.0, 0.9, 0.8], 0.5) == (False, [0.9, 0.8, 0.5])  # 1.0 left the window
