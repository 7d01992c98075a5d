"""Classes are earned, not claimed (issue 9, point 3): a run's origin follows from how the request came in
(browser session: dashboard; API token: api); `schedule` and `system` come only from the platform; staff may
set any origin; an eval of a run the user cannot see answers exactly like an eval of a missing run."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runs.models import Run, RunStatus
from tests.runs.helpers import (  # noqa: F401 (fixtures)
    TEST_KIND,
    _fast_password_hashing,
    _fresh_policy_cache,
    handoffs,
    other_user,
    register_test_kind,
    staff,
    user,
)

register_test_kind()
pytestmark = pytest.mark.django_db


def token_client(username: str, password: str) -> APIClient:
    client = APIClient()
    answer = client.post("/api/auth/token/", {"username": username, "password": password}, format="json")
    assert answer.status_code == 200, answer.content
    client.credentials(HTTP_AUTHORIZATION=f"Token {answer.json()['token']}")
    return client


def session_client(user_obj) -> APIClient:
    """A logged-in browser: the dashboard's submit form posts to the API with this session."""
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user_obj)
    client.get("/runs/new/")  # sets the CSRF cookie, as the page does for the form's fetch
    client.credentials(HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)
    return client


def submit(client, **body):
    return client.post("/api/runs/", {"name": "r", "kind": TEST_KIND, "config": {"steps": 1}} | body, format="json")


def test_origin_is_earned_from_how_the_request_came_in(user, handoffs):
    by_token = submit(token_client("alice", "pw-alice"))
    assert by_token.status_code == 201, by_token.content
    assert (by_token.json()["origin"], by_token.json()["run_class"]) == ("api", "app")
    by_session = submit(session_client(user))
    assert by_session.status_code == 201, by_session.content
    assert (by_session.json()["origin"], by_session.json()["run_class"]) == ("dashboard", "interactive")
    # Repeating the earned origin is fine (the dashboard form sends origin "dashboard").
    assert submit(session_client(user), origin="dashboard").json()["origin"] == "dashboard"
    assert submit(token_client("alice", "pw-alice"), origin="api").json()["origin"] == "api"


@pytest.mark.parametrize("via", ["token", "session"])
@pytest.mark.parametrize("claimed", ["schedule", "system"])
def test_platform_origins_are_403_for_users(user, handoffs, via, claimed):
    client = token_client("alice", "pw-alice") if via == "token" else session_client(user)
    answer = submit(client, origin=claimed)
    assert answer.status_code == 403, answer.content
    assert answer.json()["field"] == "origin" and "only by the platform" in answer.json()["detail"]
    assert not Run.objects.exists()


@pytest.mark.parametrize("via,claimed", [("token", "dashboard"), ("session", "api")])
def test_the_other_users_origin_is_403(user, handoffs, via, claimed):
    client = token_client("alice", "pw-alice") if via == "token" else session_client(user)
    answer = submit(client, origin=claimed)
    assert answer.status_code == 403 and answer.json()["field"] == "origin"
    assert not Run.objects.exists()


def test_unknown_origin_is_still_400(user):
    answer = submit(token_client("alice", "pw-alice"), origin="cron")
    assert answer.status_code == 400 and answer.json()["field"] == "origin"


@pytest.mark.parametrize("via", ["token", "session"])
@pytest.mark.parametrize("claimed", ["dashboard", "api", "schedule", "system"])
def test_staff_may_set_any_origin(staff, handoffs, via, claimed):
    client = token_client("root", "pw-root") if via == "token" else session_client(staff)
    answer = submit(client, origin=claimed)
    assert answer.status_code == 201, answer.content
    assert answer.json()["origin"] == claimed


def test_schema_documents_403_and_429_on_submit(user):
    schema = token_client("alice", "pw-alice").get("/api/schema/", {"format": "json"}).json()
    responses = schema["paths"]["/api/runs/"]["post"]["responses"]
    assert {"201", "400", "403", "429"} <= set(responses)
    settings_props = schema["components"]["schemas"]["ConcurrencySettings"]["properties"]
    assert {
        "max_queued_per_user",
        "max_running_per_user",
        "default_time_limit_seconds",
        "max_time_limit_seconds",
    } <= set(settings_props)


# --- eval of another user's run: no existence oracle ---------------------------------------------------------


def trained_run(owner) -> Run:
    return Run.objects.create(
        name="trained", origin="api", run_class="app", kind="rl_train", owner=owner, status=RunStatus.SUCCEEDED
    )


def eval_answer(client, source: int) -> tuple[int, dict]:
    answer = submit(client, kind="eval", config={"source_run": source})
    body = answer.json()
    return answer.status_code, {
        k: (v.replace(str(source), "<id>") if isinstance(v, str) else v) for k, v in body.items()
    }


@pytest.mark.parametrize("via", ["token", "session"])
def test_eval_of_an_invisible_run_answers_like_a_missing_run(user, other_user, handoffs, via):
    theirs = trained_run(other_user).pk
    missing = theirs + 1000
    assert not Run.objects.filter(pk=missing).exists()
    client = token_client("alice", "pw-alice") if via == "token" else session_client(user)
    hidden = eval_answer(client, theirs)
    absent = eval_answer(client, missing)
    assert hidden == absent
    assert hidden[0] == 400 and hidden[1]["field"] == "config.source_run"
    assert not Run.objects.filter(kind="eval").exists()
    # Nothing else tells them apart either: the run itself is a 404 with the same text.
    other_detail = client.get(f"/api/runs/{theirs}/").json()["detail"].replace(str(theirs), "<id>")
    assert other_detail == client.get(f"/api/runs/{missing}/").json()["detail"].replace(str(missing), "<id>")


def test_eval_of_own_run_and_staff_eval_of_any_run_are_accepted(user, staff, handoffs):
    mine = trained_run(user).pk
    own = submit(token_client("alice", "pw-alice"), kind="eval", config={"source_run": mine})
    assert own.status_code == 201, own.content
    by_staff = submit(token_client("root", "pw-root"), kind="eval", config={"source_run": mine})
    assert by_staff.status_code == 201, by_staff.content


def test_schedule_of_an_eval_still_checks_its_source_run(staff):
    boss = token_client("root", "pw-root")
    missing = boss.post(
        "/api/schedules/",
        {"name": "e", "cron": "0 3 * * *", "kind": "eval", "config": {"source_run": 999_999}},
        format="json",
    )
    assert missing.status_code == 400 and missing.json()["field"] == "config.source_run"
    mine = trained_run(staff).pk
    ok = boss.post(
        "/api/schedules/",
        {"name": "e", "cron": "0 3 * * *", "kind": "eval", "config": {"source_run": mine}},
        format="json",
    )
    assert ok.status_code == 201, ok.content
