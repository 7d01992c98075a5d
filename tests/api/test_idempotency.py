"""Idempotency-Key on submit, cancel and resume (runs/idempotency/): a retry with the same key and body answers
with the run the first request acted on and acts no more; another body is a 409 naming the key; keys are per
user and per operation, expire after 24 hours, and are refused when malformed. Twenty concurrent submits with
one key create one run (PostgreSQL, where concurrent requests really overlap)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from runs.core.lifecycle import run_finish
from runs.execution.submit import run_submit
from runs.idempotency.models import IdempotencyKey
from runs.models import Run
from runs.outbox.models import Effect
from tests.api.clients import client_for
from tests.runs.helpers import TEST_KIND

pytestmark = pytest.mark.django_db

KEY = {"HTTP_IDEMPOTENCY_KEY": "submit-7f3a"}


def test_a_retried_submit_returns_the_first_run_and_creates_nothing(user, handoffs):
    client = client_for(user)
    first = client.post("/api/runs/", _body(), format="json", **KEY)
    again = client.post("/api/runs/", _body(), format="json", **KEY)
    assert (first.status_code, again.status_code) == (201, 200), (first.content, again.content)
    assert first.json()["id"] == again.json()["id"] and Run.objects.count() == 1
    assert (first["Idempotent-Replayed"], again["Idempotent-Replayed"]) == ("false", "true")
    assert Effect.objects.filter(kind="dispatch").count() == 1  # granted and launched once
    # The same body with its keys in another order is the same request.
    reordered = dict(reversed(list(_body().items())))
    assert client.post("/api/runs/", reordered, format="json", **KEY).status_code == 200


def test_the_same_key_with_another_body_is_a_409_naming_the_key(user, handoffs):
    client = client_for(user)
    assert client.post("/api/runs/", _body(), format="json", **KEY).status_code == 201
    other = client.post("/api/runs/", _body(name="other"), format="json", **KEY)
    assert other.status_code == 409, other.content
    assert other.json()["field"] == "Idempotency-Key" and other.json()["code"] == "idempotency_key_reused"
    assert "submit-7f3a" in other.json()["detail"] and Run.objects.count() == 1


def test_keys_are_per_user_and_per_operation(user, other_user, handoffs):
    mine = client_for(user).post("/api/runs/", _body(), format="json", **KEY)
    theirs = client_for(other_user).post("/api/runs/", _body(), format="json", **KEY)
    assert (mine.status_code, theirs.status_code) == (201, 201) and mine.json()["id"] != theirs.json()["id"]
    cancel = client_for(user).post(f"/api/runs/{mine.json()['id']}/cancel/", format="json", **KEY)
    assert cancel.status_code == 200 and cancel["Idempotent-Replayed"] == "false"  # another operation: it acts


def test_a_refused_request_records_no_key_and_its_retry_is_judged_again(user, handoffs):
    client = client_for(user)
    bad = client.post("/api/runs/", _body(config={"steps": "many"}), format="json", **KEY)
    assert bad.status_code == 400 and not IdempotencyKey.objects.exists()
    assert client.post("/api/runs/", _body(), format="json", **KEY).status_code == 201


def test_a_key_expires_after_a_day(user, handoffs):
    client = client_for(user)
    first = client.post("/api/runs/", _body(), format="json", **KEY)
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=24, seconds=1))
    later = client.post("/api/runs/", _body(name="next day"), format="json", **KEY)
    assert later.status_code == 201 and later.json()["id"] != first.json()["id"]
    assert IdempotencyKey.objects.count() == 1  # the expired row is gone


@pytest.mark.parametrize("key", ["", "x" * 201, "has space", "caf\u00e9", "tab\there"])
def test_a_malformed_key_is_a_400_naming_the_header(user, handoffs, key):
    answer = client_for(user).post("/api/runs/", _body(), format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert answer.status_code == 400 and answer.json()["field"] == "Idempotency-Key", answer.content
    assert not Run.objects.exists()


def test_a_retried_cancel_or_resume_acts_once(user, handoffs):
    client = client_for(user)
    run = run_submit(owner=user, name="r", origin="api", kind=_body()["kind"], config={"steps": 2})
    url = f"/api/runs/{run.pk}/cancel/"
    assert client.post(url, format="json", **KEY).status_code == 200
    again = client.post(url, format="json", **KEY)
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    run_finish(run=Run.objects.get(pk=run.pk), status="cancelled")  # the job ended: cancelled
    resume = {"HTTP_IDEMPOTENCY_KEY": "resume-1"}
    body = {"from_scratch": True}
    first = client.post(f"/api/runs/{run.pk}/resume/", body, format="json", **resume)
    assert first.status_code == 200 and first.json()["status"] in ("queued", "starting"), first.content
    attempt = Run.objects.get(pk=run.pk).attempt
    retry = client.post(f"/api/runs/{run.pk}/resume/", body, format="json", **resume)
    assert retry.status_code == 200 and retry["Idempotent-Replayed"] == "true"
    assert Run.objects.get(pk=run.pk).attempt == attempt  # not resumed twice


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_submits_with_one_key_create_one_run(user, handoffs):
    if connection.vendor != "postgresql":
        pytest.fail("concurrent requests need PostgreSQL: run with a postgres DATABASE_URL", pytrace=False)
    start = threading.Barrier(20)
    answers: list = [None] * 20

    def submit(i: int) -> None:
        try:
            start.wait()
            answers[i] = client_for(user).post("/api/runs/", _body(), format="json", **KEY)
        finally:
            connection.close()

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    codes = sorted(a.status_code for a in answers)
    assert codes == [200] * 19 + [201], [a.content for a in answers]
    assert Run.objects.count() == 1 and {a.json()["id"] for a in answers} == {Run.objects.get().pk}


def _body(**changes) -> dict:
    return {"name": "r", "origin": "api", "kind": TEST_KIND, "config": {"steps": 2}} | changes
