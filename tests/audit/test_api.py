"""GET /api/audit/ and the staff page /audit/: who may read, read-only, filters (and hostile values: 400 naming
the field), pagination, escaping; the request id header; `cancelled_by` / `resumed_by` in the run JSON and on
the run page."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

from runs.audit.models import AuditEntry
from runs.audit.request_id import HEADER
from runs.models import Run
from runs.scheduling.enqueue import run_resume
from tests.runs.helpers import TEST_KIND

pytestmark = pytest.mark.django_db
SCRIPT = "<script>alert(1)</script>"


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def submit(client: APIClient, name: str = "r") -> dict:
    answer = client.post("/api/runs/", {"name": name, "kind": TEST_KIND, "config": {"steps": 1}}, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()


def test_only_staff_read_and_nobody_writes(user, staff) -> None:
    assert APIClient().get("/api/audit/").status_code == 401
    assert session(user).get("/api/audit/").status_code == 403
    root = session(staff)
    assert root.get("/api/audit/").status_code == 200
    for method in ("post", "put", "patch", "delete"):
        assert getattr(root, method)("/api/audit/", {}, format="json").status_code == 405, method
        assert getattr(session(user), method)("/api/audit/", {}, format="json").status_code == 403, method
    assert session(user).get("/audit/").status_code == 403
    assert APIClient().get("/audit/").status_code == 302  # to the login page


def test_filters_newest_first_and_pages(user, other_user, staff, handoffs) -> None:
    mine = [submit(session(user))["id"] for _ in range(3)]
    theirs = submit(session(other_user))["id"]
    session(user).post(f"/api/runs/{mine[0]}/cancel/", format="json")
    root = session(staff)
    everything = root.get("/api/audit/").json()
    assert everything["count"] == 5
    assert [r["id"] for r in everything["results"]] == sorted((r["id"] for r in everything["results"]), reverse=True)
    assert everything["results"][0]["action"] == "run.cancel" and everything["results"][0]["actor"] == "alice"
    assert root.get("/api/audit/", {"actor": "alice"}).json()["count"] == 4
    assert root.get("/api/audit/", {"actor": str(other_user.pk)}).json()["count"] == 1
    assert root.get("/api/audit/", {"actor": "platform"}).json()["count"] == 0
    assert root.get("/api/audit/", {"action": "run.cancel"}).json()["count"] == 1
    assert root.get("/api/audit/", {"target": f"run:{theirs}"}).json()["results"][0]["actor"] == "bob"
    assert root.get("/api/audit/", {"since": "2999-01-01T00:00:00Z"}).json()["count"] == 0
    assert root.get("/api/audit/", {"until": "2000-01-01T00:00:00"}).json()["count"] == 0
    assert root.get("/api/audit/", {"since": "2000-01-01T00:00:00+02:00"}).json()["count"] == 5
    row = root.get("/api/audit/", {"action": "run.cancel"}).json()["results"][0]
    assert row["target"] == f"run:{mine[0]}" and row["before"] == {"status": "starting"}
    assert (
        row["actor_user_id"] == user.pk
        and row["actor_token"] is None
        and re.fullmatch(r"[0-9a-f]{32}", row["request_id"])
    )
    page = root.get("/api/audit/", {"page": 1}).json()
    assert page["next"] is None and page["previous"] is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("actor", SCRIPT),
        ("actor", "x" * 151),
        ("actor", "alice bob"),
        ("actor", "alice\n"),
        ("actor", "a/b"),
        ("action", "run.delete"),
        ("action", "' OR 1=1 --"),
        ("target", "run"),
        ("target", "user:1"),
        ("target", "run:../../etc/passwd"),
        ("target", "run:" + "1" * 100),
        ("since", "yesterday"),
        ("since", "2026-02-31T00:00:00"),
        ("until", "9" * 200),
        ("until", "2026-12-04T25:00:00"),
    ],
)
def test_hostile_filter_values_are_400_naming_the_field(staff, field, value) -> None:
    answer = session(staff).get("/api/audit/", {field: value})
    assert answer.status_code == 400, answer.content
    assert answer.json()["field"] == field
    page = session(staff).get("/audit/", {field: value})
    assert page.status_code == 400 and SCRIPT.encode() not in page.content


def test_the_page_escapes_every_value(user, staff, handoffs) -> None:
    run = submit(session(user), name=SCRIPT)
    page = session(staff).get("/audit/", {"target": f"run:{run['id']}"})
    assert page.status_code == 200
    html = page.content.decode()
    assert SCRIPT not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'href="/audit/"' in session(staff).get("/").content.decode()  # in the staff nav
    assert 'href="/audit/"' not in session(user).get("/").content.decode()


def test_request_id_kept_when_well_formed_else_fresh(user, handoffs) -> None:
    client = session(user)
    kept = client.post(
        "/api/runs/",
        {"name": "r", "kind": TEST_KIND, "config": {"steps": 1}},
        format="json",
        HTTP_X_REQUEST_ID="abc-123",
    )
    assert kept[HEADER] == "abc-123"
    assert AuditEntry.objects.get(target_id=str(kept.json()["id"])).request_id == "abc-123"
    for bad in ("a b", "x" * 65, "<script>", ""):
        answer = client.get("/api/runs/", HTTP_X_REQUEST_ID=bad)
        assert re.fullmatch(r"[0-9a-f]{32}", answer[HEADER]), bad


def test_run_json_and_page_say_who_cancelled_and_resumed(user, staff, handoffs) -> None:
    alice, root = session(user), session(staff)
    run_ids = [submit(alice)["id"] for _ in range(5)]
    queued = run_ids[-1]  # max_total 4: the fifth waits
    fresh = alice.get(f"/api/runs/{queued}/").json()
    assert (fresh["cancelled_by"], fresh["resumed_by"]) == (None, None)
    alice.post(f"/api/runs/{queued}/cancel/", format="json")
    assert alice.get(f"/api/runs/{queued}/").json()["cancelled_by"] == "alice"
    assert root.post(f"/api/runs/{queued}/resume/", {"from_scratch": True}, format="json").status_code == 200
    root.post(f"/api/runs/{queued}/cancel/", format="json")
    body = alice.get(f"/api/runs/{queued}/").json()
    assert (body["cancelled_by"], body["resumed_by"]) == ("root", "root")
    run_resume(run=Run.objects.get(pk=queued), by="the platform (auto-resume)", from_scratch=True)
    listed = {r["id"]: r for r in alice.get("/api/runs/").json()["results"]}
    assert listed[queued]["resumed_by"] == "platform" and listed[run_ids[0]]["cancelled_by"] is None
    page = alice.get(f"/runs/{queued}/").content.decode()
    assert "cancelled by root" in page and "resumed by platform" in page
