"""REST API: authentication and permissions, and the shape of the runs endpoints' answers (submit, detail,
list, cancel, resume, events), the schema, and the rl_train config checks at submit. Slots, settings and
resources are in test_api_slots.py."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runs.core.lifecycle import run_finish
from runs.models import Run
from runs.scheduling.concurrency import settings_update
from tests.api.clients import RUN_FIELDS, client_for, post_run, session_for

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "method,url",
    [
        ("get", "/api/runs/"),
        ("post", "/api/runs/"),
        ("get", "/api/runs/1/"),
        ("post", "/api/runs/1/cancel/"),
        ("post", "/api/runs/1/resume/"),
        ("get", "/api/runs/1/events/"),
        ("get", "/api/slots/"),
        ("post", "/api/slots/dry-run/"),
        ("get", "/api/settings/concurrency/"),
        ("patch", "/api/settings/concurrency/"),
        ("put", "/api/settings/concurrency/"),
        ("get", "/api/schema/"),
    ],
)
def test_unauthenticated_is_refused(method, url):
    assert getattr(APIClient(), method)(url, {}, format="json").status_code in (401, 403)


def test_token_auth(user):
    client = APIClient()
    bad = client.post("/api/auth/token/", {"username": "alice", "password": "nope"}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "password"
    token = client.post("/api/auth/token/", {"username": "alice", "password": "pw-alice"}, format="json").json()
    assert set(token) == {"token"}
    client.credentials(HTTP_AUTHORIZATION=f"Token {token['token']}")
    assert client.get("/api/runs/").status_code == 200


def test_session_auth(user):
    client = APIClient(enforce_csrf_checks=False)
    assert client.login(username="alice", password="pw-alice")
    assert client.get("/api/slots/").status_code == 200


def test_submit_and_detail_shape(user, handoffs):
    client = client_for(user)
    created = post_run(client)
    assert created.status_code == 201, created.content
    body = created.json()
    assert set(body) == RUN_FIELDS
    assert body["owner"] == "alice" and body["run_class"] == "app" and body["status"] == "starting"
    assert body["config"] == {"steps": 2} and body["position"] is None and body["pending_reason"] is None
    assert body["eta_seconds"] is None and isinstance(body["queued_seconds"], float)
    detail = client.get(f"/api/runs/{body['id']}/").json()
    assert detail["id"] == body["id"] and set(detail) == RUN_FIELDS


def test_queued_run_has_position_reason_eta(user, staff, handoffs):
    settings_update(changes={"max_total": 1}, partial=True, by=staff)
    client = client_for(user)
    post_run(client)
    queued = post_run(client).json()
    assert queued["status"] == "queued"
    assert queued["position"] == {"in_class": 1, "overall": 1}
    assert queued["pending_reason"] == "class_limit_reached"
    assert queued["eta_seconds"] is None or queued["eta_seconds"] > 0


@pytest.mark.parametrize(
    "body,field",
    [
        ({"origin": "cli"}, "origin"),
        ({"kind": "nope"}, "kind"),
        ({"config": {"steps": "x"}}, "config.steps"),
        ({"config": {"lr": 0.1}}, "config.lr"),
        ({"config": [1]}, "config"),
        ({"auto_resume": "true"}, "auto_resume"),
        ({"auto_resume": 1}, "auto_resume"),
    ],
)
def test_submit_rejects_bad_input_naming_the_field(user, body, field):
    answer = post_run(client_for(user), **body)
    assert answer.status_code == 400
    assert answer.json()["field"] == field and field in answer.json()["detail"]
    assert not Run.objects.exists()


def test_submit_sets_auto_resume(user, handoffs):
    body = post_run(client_for(user), auto_resume=True).json()
    assert body["auto_resume"] is True and Run.objects.get(pk=body["id"]).auto_resume
    assert post_run(client_for(user)).json()["auto_resume"] is False


def test_missing_name_is_400(user):
    answer = client_for(user).post("/api/runs/", {"origin": "api"}, format="json")
    assert answer.status_code == 400 and answer.json()["field"] == "name"


def test_list_is_paginated_filtered_and_private(user, other_user, staff, handoffs):
    settings_update(changes={"max_total": 1}, partial=True, by=staff)
    mine = [post_run(client_for(user)).json()["id"] for _ in range(2)]
    theirs = post_run(session_for(other_user), origin="dashboard").json()["id"]  # dashboard: earned by a session
    page = client_for(user).get("/api/runs/").json()
    assert set(page) == {"count", "next", "previous", "results"}
    assert [r["id"] for r in page["results"]] == sorted(mine, reverse=True)
    assert [r["id"] for r in client_for(staff).get("/api/runs/").json()["results"]] == [theirs, *reversed(mine)]
    queued = client_for(user).get("/api/runs/", {"status": "queued"}).json()["results"]
    assert [r["id"] for r in queued] == [mine[1]]
    assert client_for(staff).get("/api/runs/", {"run_class": "interactive"}).json()["count"] == 1
    for param in ("status", "run_class"):
        bad = client_for(user).get("/api/runs/", {param: "bogus"})
        assert bad.status_code == 400 and bad.json()["field"] == param


def test_other_users_runs_are_invisible(user, other_user, staff, handoffs):
    run_id = post_run(client_for(other_user)).json()["id"]
    client = client_for(user)
    for method, url in [
        ("get", f"/api/runs/{run_id}/"),
        ("post", f"/api/runs/{run_id}/cancel/"),
        ("post", f"/api/runs/{run_id}/resume/"),
        ("get", f"/api/runs/{run_id}/events/"),
    ]:
        assert getattr(client, method)(url).status_code == 404
    assert client_for(staff).get(f"/api/runs/{run_id}/").status_code == 200
    assert client_for(staff).post(f"/api/runs/{run_id}/cancel/").json()["status"] == "stopping"


def test_cancel_resume_and_events(user, handoffs):
    client = client_for(user)
    run_id = post_run(client).json()["id"]
    assert client.post(f"/api/runs/{run_id}/resume/").status_code == 409
    run_finish(run=Run.objects.get(pk=run_id), status="failed", error="x")
    assert client.post(f"/api/runs/{run_id}/cancel/").status_code == 409
    assert client.post(f"/api/runs/{run_id}/resume/").json()["code"] == "no_checkpoint"  # tests/api/test_resume.py
    resumed = client.post(f"/api/runs/{run_id}/resume/", {"from_scratch": True}, format="json").json()
    assert resumed["status"] == "starting"
    events = client.get(f"/api/runs/{run_id}/events/").json()
    assert [e["data"]["status"] for e in events] == ["queued", "starting", "failed", "queued", "starting"]
    assert set(events[0]) == {"run", "seq", "ts", "type", "data"} and events[0]["run"] == run_id
    later = client.get(f"/api/runs/{run_id}/events/", {"after": 3}).json()
    assert [e["seq"] for e in later] == [4, 5]
    assert client.get(f"/api/runs/{run_id}/events/", {"after": "-1"}).json()["field"] == "after"


def test_schema_is_openapi(user):
    schema = client_for(user).get("/api/schema/", {"format": "json"}).json()
    assert schema["openapi"].startswith("3.")
    for path in (
        "/api/runs/",
        "/api/runs/{run_id}/",
        "/api/runs/{run_id}/cancel/",
        "/api/runs/{run_id}/resume/",
        "/api/runs/{run_id}/events/",
        "/api/slots/",
        "/api/slots/dry-run/",
        "/api/settings/concurrency/",
        "/api/auth/token/",
    ):
        assert path in schema["paths"], path


@pytest.mark.parametrize("config,field", [({"bogus": 1}, "config.bogus"), ({"lr": "fast"}, "config.lr")])
def test_rl_train_config_is_validated_against_trainer_schema(user, config, field):
    answer = client_for(user).post("/api/runs/", {"name": "r", "origin": "api", "config": config}, format="json")
    assert answer.status_code == 400
    body = answer.json()
    assert body["field"] == field and body["detail"].startswith(f"{field}: ")


def test_rl_train_is_the_default_kind(user, handoffs):
    answer = session_for(user).post(
        "/api/runs/", {"name": "r", "origin": "dashboard", "config": {"steps": 2}}, format="json"
    )
    assert answer.status_code == 201, answer.content
    assert answer.json()["kind"] == "rl_train"
