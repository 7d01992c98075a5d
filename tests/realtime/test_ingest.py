"""POST /api/runs/<id>/ingest/: per-run token, validation naming the field, idempotent storage, summary fold."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runs.models import RunEvent, RunStatus
from tests.realtime.conftest import gate, run_make, train, user_make

pytestmark = pytest.mark.django_db


def post(run, body, token=None):
    client = APIClient()
    token = run.ingest_token if token is None else token
    return client.post(f"/api/runs/{run.pk}/ingest/", body, format="json", HTTP_AUTHORIZATION=f"Bearer {token}")


def test_batch_stored_once_and_summary_folded():
    run = run_make(user_make("alice"))
    batch = [
        gate(1, version=0),
        train(2, step=1),
        {"seq": 3, "type": "version", "data": {"version": 1, "published_at": 1.5, "pause_ms": 12.0}},
        train(4, step=2),
    ]
    first = post(run, batch)
    assert first.status_code == 200, first.content
    assert first.json() == {
        "stored": 4,
        "duplicates": 0,
        "last_seq": 4,
        "status": "running",
        "dropped": 0,
        "commands": [],
    }
    again = post(run, {"events": batch[1:] + [gate(5, version=1)]})  # a retried post overlapping the first
    assert again.json() == {
        "stored": 1,
        "duplicates": 3,
        "last_seq": 5,
        "status": "running",
        "dropped": 0,
        "commands": [],
    }
    rows = list(RunEvent.objects.filter(run=run).values_list("seq", "source", "source_seq", "type"))
    assert rows == [
        (1, "attempt-0", 1, "gate"),
        (2, "attempt-0", 2, "train"),
        (3, "attempt-0", 3, "version"),
        (4, "attempt-0", 4, "train"),
        (5, "attempt-0", 5, "gate"),
    ]
    run.refresh_from_db()
    assert run.last_seq == 5
    assert run.summary["train"]["step"] == 2
    assert run.summary["version"]["version"] == 1
    assert run.summary["gate"]["version"] == 1
    assert run.heartbeat_at is not None


def test_a_relaunched_attempt_restarts_its_counter_without_colliding():
    run = run_make(user_make("bob"))
    assert post(run, [train(1, step=1)]).json()["stored"] == 1
    run.attempt = 1
    run.save(update_fields=["attempt"])
    assert post(run, [train(1, step=7)]).json() == {
        "stored": 1,
        "duplicates": 0,
        "last_seq": 2,
        "status": "running",
        "dropped": 0,
        "commands": [],
    }


def test_empty_post_is_a_heartbeat_and_reports_a_cancel_request():
    run = run_make(user_make("carol"), status=RunStatus.STOPPING)
    response = post(run, [])
    assert response.json() == {
        "stored": 0,
        "duplicates": 0,
        "last_seq": 0,
        "status": "stopping",
        "dropped": 0,
        "commands": [],
    }
    run.refresh_from_db()
    assert run.heartbeat_at is not None


def test_invalid_event_rejects_the_whole_batch_naming_the_field():
    run = run_make(user_make("dave"))
    bad = {"seq": 2, "type": "gate", "data": {"state": "open", "version": 0, "active": 0, "waiting": 0}}
    response = post(run, [train(1, step=1), bad])
    assert response.status_code == 400
    assert response.json()["detail"] == "events[1].data: event seq 2: gate event lacks ['engines']"
    assert response.json()["field"] == "events[1].data"
    assert RunEvent.objects.filter(run=run).count() == 0
    assert post(run, {"events": "nope"}).json()["detail"].startswith("events: expected a JSON list")
    assert post(run, [{"seq": 0, "type": "log"}]).json()["detail"] == "events[0].seq: expected a positive integer"


def test_token_is_required_and_bound_to_its_run():
    alice = user_make("erin")
    run, other = run_make(alice), run_make(alice)
    refused = post(run, [train(1, 1)], token="")
    assert refused.status_code == 401
    wrong = post(run, [train(1, 1)], token=other.ingest_token)
    client = APIClient()
    client.force_authenticate(alice)  # a logged-in user is not the job
    assert client.post(f"/api/runs/{run.pk}/ingest/", [train(1, 1)], format="json").status_code == 401
    # No such run: the very same answer as a wrong token, so run ids cannot be probed with made-up tokens.
    missing = post(type("R", (), {"pk": 999999, "ingest_token": other.ingest_token})(), [])
    assert (missing.status_code, missing.json()) == (wrong.status_code, wrong.json()) == (401, refused.json())
    assert RunEvent.objects.filter(run=run).count() == 0


def test_a_finished_run_answers_409_so_its_job_stops():
    run = run_make(user_make("fred"), status=RunStatus.CANCELLED)
    response = post(run, [train(1, 1)])
    assert response.status_code == 409
    assert response.json()["detail"] == f"status: run {run.pk} is cancelled; it accepts no more events"
    assert RunEvent.objects.filter(run=run).count() == 0
