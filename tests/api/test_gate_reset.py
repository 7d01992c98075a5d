"""Staff reset of a poisoned gate (runs/execution/controls.py): who may ask, what is checked, the audit record, delivery
to the job in its ingest replies, and the job's `control` event answering it. Real PostgreSQL; the job is the
real ingest endpoint driven with the trainer's event schema."""

from __future__ import annotations

import time

import pytest
from django.test import Client
from rest_framework.test import APIClient

from runs.core.lifecycle import run_transition
from runs.execution.submit import run_submit
from runs.models import RunControl, RunStatus
from tests.runs.helpers import TEST_JOB_KIND  # fixtures and the kind's registration: tests/api/conftest.py
from tests.security.test_origins import session_client  # a logged-in browser, CSRF enforced

pytestmark = pytest.mark.django_db


def ingest(run, events: list[dict]) -> dict:
    answer = Client().post(
        f"/api/runs/{run.pk}/ingest/",
        data=events,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )
    assert answer.status_code == 200, answer.content
    return answer.json()


def gate(state: str) -> dict:
    engines = [{"engine": "engine-0", "state": state, "version": 3, "active": 0, "waiting": 2, "sessions": 1}]
    return {
        "type": "gate",
        "ts": time.time(),
        "data": {"state": state, "version": 3, "active": 0, "waiting": 2, "engines": engines},
    }


@pytest.fixture
def poisoned_run(user, handoffs):
    run = run_submit(owner=user, name="r", origin="api", kind=TEST_JOB_KIND, config={})
    run = run_transition(run=run, status=RunStatus.RUNNING)
    ingest(run, [{"seq": 1, **gate("poisoned")}])
    return run


def test_staff_reset_is_audited_delivered_to_the_job_and_answered(poisoned_run, staff) -> None:
    url = f"/api/runs/{poisoned_run.pk}/gate-reset/"
    answer = session_client(staff).post(
        url, {"reason": "engine-0 <b>restarted</b>; its request was lost"}, format="json"
    )
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert body["kind"] == "gate_reset" and body["requested_by"] == "root" and body["acked_at"] is None
    control = RunControl.objects.get(pk=body["id"])
    assert control.reason == "engine-0 <b>restarted</b>; its request was lost"  # stored as given; escaped on render
    log = poisoned_run.events.filter(type="log").get()
    assert log.data["control"] == control.pk and "requested by root" in log.data["message"]

    # Every reply carries the unanswered command, until the job's control event names it.
    reply = ingest(poisoned_run, [])
    assert reply["commands"] == [
        {"id": control.pk, "kind": "gate_reset", "reason": control.reason, "requested_by": "root"}
    ]
    assert ingest(poisoned_run, [])["commands"] == reply["commands"]
    done = {"id": control.pk, "kind": "gate_reset", "outcome": "applied", "detail": "every engine held v3"}
    reply = ingest(
        poisoned_run, [{"seq": 2, "type": "control", "ts": time.time(), "data": done}, {"seq": 3, **gate("open")}]
    )
    assert reply["commands"] == []
    control.refresh_from_db()
    assert control.delivered_at is not None and control.acked_at is not None
    assert (control.outcome, control.detail) == ("applied", "every engine held v3")


def test_only_staff_may_reset_and_only_a_poisoned_running_gate(poisoned_run, user, other_user, staff) -> None:
    url = f"/api/runs/{poisoned_run.pk}/gate-reset/"
    owner = session_client(user).post(url, {"reason": "mine"}, format="json")
    assert owner.status_code == 403 and "staff" in owner.json()["detail"]
    assert session_client(other_user).post(url, {"reason": "x"}, format="json").status_code == 404  # not revealed
    assert APIClient().post(url, {"reason": "x"}, format="json").status_code in (401, 403)
    no_csrf = APIClient(enforce_csrf_checks=True)
    no_csrf.force_login(staff)
    assert no_csrf.post(url, {"reason": "x"}, format="json").status_code == 403

    root = session_client(staff)
    for body, field in (({}, "reason"), ({"reason": "  "}, "reason"), ({"reason": "x" * 501}, "reason"), ([], "body")):
        answer = root.post(url, body, format="json")
        assert answer.status_code == 400 and answer.json()["field"] == field, answer.content
    assert root.post("/api/runs/999999/gate-reset/", {"reason": "x"}, format="json").status_code == 404

    ingest(poisoned_run, [{"seq": 2, **gate("open")}])
    answer = root.post(url, {"reason": "x"}, format="json")
    assert answer.status_code == 409 and "not poisoned" in answer.json()["detail"]
    ingest(poisoned_run, [{"seq": 3, **gate("poisoned")}])
    for _ in range(4):
        assert root.post(url, {"reason": "again"}, format="json").status_code == 202
    assert root.post(url, {"reason": "one too many"}, format="json").status_code == 409  # bounded
    assert RunControl.objects.filter(run=poisoned_run).count() == 4

    run_transition(run=poisoned_run, status=RunStatus.STOPPING)
    answer = root.post(url, {"reason": "x"}, format="json")
    assert answer.status_code == 409 and "stopping" in answer.json()["detail"]
