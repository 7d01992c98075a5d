"""Resource abuse is refused at submit (issue 9, point 2): every run has a finite time limit (staff default and
maximum), and per-user caps on queued and active runs answer 429 naming the cap, also under concurrent submits.
Everything goes through HTTP (token or session) against the real PostgreSQL database."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from runs.execution.followups import eval_run_submit
from runs.execution.schedules import schedules_submit_due
from runs.execution.submit import run_submit
from runs.execution.sweeps import runs_enforce_time_limits
from runs.models import Run, RunStatus, Schedule
from runs.scheduling.concurrency import settings_update
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

DEFAULTS = {
    "max_queued_per_user": 20,
    "max_running_per_user": 8,
    "default_time_limit_seconds": 86400,
    "max_time_limit_seconds": 604800,
}


def token_client(username: str, password: str) -> APIClient:
    """An API client authenticated the way scripts are: a token from POST /api/auth/token/."""
    client = APIClient()
    answer = client.post("/api/auth/token/", {"username": username, "password": password}, format="json")
    assert answer.status_code == 200, answer.content
    client.credentials(HTTP_AUTHORIZATION=f"Token {answer.json()['token']}")
    return client


def staff_session(staff_user) -> APIClient:
    client = APIClient()
    client.force_login(staff_user)
    return client


def set_limits(staff_user, **changes):
    answer = staff_session(staff_user).patch("/api/settings/concurrency/", changes, format="json")
    assert answer.status_code == 200, answer.content
    return answer.json()


def submit(client, **body):
    return client.post("/api/runs/", {"name": "r", "kind": TEST_KIND, "config": {"steps": 1}} | body, format="json")


def fill_the_cluster(other) -> Run:
    """One slot, held by another user's run: everything submitted afterwards stays queued."""
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    run = run_submit(owner=other, name="holder", origin="api", kind=TEST_KIND, config={"steps": 1})
    assert run.status == RunStatus.STARTING
    return run


# --- time limits --------------------------------------------------------------------------------------------


def test_every_run_gets_the_default_time_limit(user, staff, handoffs):
    client = token_client("alice", "pw-alice")
    created = submit(client)
    assert created.status_code == 201, created.content
    assert created.json()["time_limit_seconds"] == DEFAULTS["default_time_limit_seconds"]
    set_limits(staff, default_time_limit_seconds=600)
    again = submit(client).json()
    assert again["time_limit_seconds"] == 600 and Run.objects.get(pk=again["id"]).time_limit_seconds == 600
    assert not Run.objects.filter(time_limit_seconds__isnull=True).exists()


def test_time_limit_above_the_maximum_is_400_naming_the_field(user, staff, handoffs):
    client = token_client("alice", "pw-alice")
    too_long = submit(client, time_limit_seconds=DEFAULTS["max_time_limit_seconds"] + 1)
    assert too_long.status_code == 400 and too_long.json()["field"] == "time_limit_seconds"
    assert "max_time_limit_seconds" in too_long.json()["detail"]
    set_limits(staff, max_time_limit_seconds=3600, default_time_limit_seconds=1800)
    assert submit(client, time_limit_seconds=3600).status_code == 201
    refused = submit(client, time_limit_seconds=3601)
    assert refused.status_code == 400 and refused.json()["field"] == "time_limit_seconds"
    assert "3600" in refused.json()["detail"]
    assert Run.objects.count() == 1


def test_a_run_stored_without_a_limit_is_stopped_at_the_default(user, staff, handoffs):
    set_limits(staff, default_time_limit_seconds=60)
    run = run_submit(owner=user, name="r", origin="api", kind=TEST_KIND, config={"steps": 1})
    Run.objects.filter(pk=run.pk).update(time_limit_seconds=None)  # as stored before limits were mandatory
    run.refresh_from_db()
    assert runs_enforce_time_limits(now=run.granted_at + timedelta(seconds=59)) == []
    assert runs_enforce_time_limits(now=run.granted_at + timedelta(seconds=61)) == [run.pk]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "time limit of 60 s" in run.error


# --- settings: visible, staff-only, validated -----------------------------------------------------------------


def test_limit_settings_are_visible_and_staff_only(user, staff):
    shown = staff_session(staff).get("/api/settings/concurrency/").json()
    assert {k: shown[k] for k in DEFAULTS} == DEFAULTS
    assert (
        token_client("alice", "pw-alice")
        .patch("/api/settings/concurrency/", {"max_queued_per_user": 999}, format="json")
        .status_code
        == 403
    )
    assert set_limits(staff, max_queued_per_user=5)["max_queued_per_user"] == 5
    assert set_limits(staff, max_queued_per_user=None)["max_queued_per_user"] == 20  # null: back to the default


@pytest.mark.parametrize(
    "body,field,fragment",
    [
        ({"max_queued_per_user": 0}, "max_queued_per_user", "from 1 to 100000"),
        ({"max_queued_per_user": "5"}, "max_queued_per_user", "integer"),
        ({"max_running_per_user": True}, "max_running_per_user", "integer"),
        ({"max_running_per_user": 1001}, "max_running_per_user", "from 1 to 1000"),
        ({"default_time_limit_seconds": 0}, "default_time_limit_seconds", "from 1 to"),
        ({"max_time_limit_seconds": 10**10}, "max_time_limit_seconds", "from 1 to"),
        (
            {"default_time_limit_seconds": 7200, "max_time_limit_seconds": 3600},
            "default_time_limit_seconds",
            "must not exceed max_time_limit_seconds (3600)",
        ),
    ],
)
def test_invalid_limit_settings_are_400_naming_the_field(staff, body, field, fragment):
    answer = staff_session(staff).patch("/api/settings/concurrency/", body, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["field"] == field and fragment in answer.json()["detail"]
    assert staff_session(staff).get("/api/settings/concurrency/").json()["max_time_limit_seconds"] == 604800


def test_time_limit_default_and_maximum_stay_consistent(staff, user, handoffs):
    set_limits(staff, default_time_limit_seconds=7200)
    lower = staff_session(staff).patch("/api/settings/concurrency/", {"max_time_limit_seconds": 3600}, format="json")
    assert lower.status_code == 400 and lower.json()["field"] == "max_time_limit_seconds"
    assert "at least default_time_limit_seconds (7200)" in lower.json()["detail"]
    # With the default unset, lowering the maximum is accepted and the default follows it down.
    shown = set_limits(staff, default_time_limit_seconds=None, max_time_limit_seconds=60)
    assert (shown["default_time_limit_seconds"], shown["max_time_limit_seconds"]) == (60, 60)
    assert submit(token_client("alice", "pw-alice")).json()["time_limit_seconds"] == 60


def test_settings_page_edits_the_limits_without_javascript(staff):
    client = Client()
    client.force_login(staff)
    page = client.get("/settings/").content.decode()
    for name in DEFAULTS:
        assert f'name="{name}"' in page
    saved = client.post("/settings/", {"max_total": "4", "max_queued_per_user": "7", "max_running_per_user": ""})
    assert saved.status_code == 302
    shown = staff_session(staff).get("/api/settings/concurrency/").json()
    assert shown["max_queued_per_user"] == 7 and shown["max_running_per_user"] == 8
    bad = client.post("/settings/", {"default_time_limit_seconds": "900000"})  # above the default maximum
    assert bad.status_code == 400
    html = bad.content.decode()
    assert 'id="default_time_limit_seconds-error"' in html and "must not exceed max_time_limit_seconds" in html


# --- per-user caps ----------------------------------------------------------------------------------------------


def test_queued_cap_is_429_naming_the_cap_and_applies_to_staff(user, other_user, staff, handoffs):
    fill_the_cluster(other_user)
    set_limits(staff, max_queued_per_user=2)
    client = token_client("alice", "pw-alice")
    assert [submit(client).status_code for _ in range(2)] == [201, 201]
    refused = submit(client)
    assert refused.status_code == 429
    body = refused.json()
    assert body["field"] == "max_queued_per_user"
    assert "you have 2 queued runs" in body["detail"] and "max_queued_per_user" in body["detail"]
    assert Run.objects.filter(owner=user).count() == 2
    assert submit(token_client("bob", "pw-bob")).status_code == 201  # the cap is per user
    boss = token_client("root", "pw-root")
    assert [submit(boss).status_code for _ in range(3)] == [201, 201, 429]  # staff are not exempt


def test_running_cap_is_429_naming_the_cap(user, staff, handoffs):
    set_limits(staff, max_total=4, max_running_per_user=2)
    client = token_client("alice", "pw-alice")
    assert [submit(client).json()["status"] for _ in range(2)] == ["starting", "starting"]
    refused = submit(client)
    assert refused.status_code == 429 and refused.json()["field"] == "max_running_per_user"
    assert "you have 2 active runs" in refused.json()["detail"]
    run_id = Run.objects.filter(owner=user).first().pk
    assert client.post(f"/api/runs/{run_id}/cancel/").status_code == 200  # stopping still counts as active
    assert submit(client).status_code == 429


def test_resume_is_capped_like_a_submit(user, other_user, staff, handoffs):
    fill_the_cluster(other_user)
    client = token_client("alice", "pw-alice")
    first = submit(client).json()["id"]
    assert client.post(f"/api/runs/{first}/cancel/").json()["status"] == "cancelled"
    set_limits(staff, max_queued_per_user=1)
    assert submit(client).status_code == 201
    refused = client.post(f"/api/runs/{first}/resume/", {"from_scratch": True}, format="json")
    assert refused.status_code == 429 and refused.json()["field"] == "max_queued_per_user"
    assert Run.objects.get(pk=first).status == RunStatus.CANCELLED


def test_platform_rule_schedules_are_capped_automatic_evals_are_not(user, other_user, staff, handoffs):
    fill_the_cluster(other_user)
    set_limits(staff, max_queued_per_user=1)
    assert submit(token_client("alice", "pw-alice")).status_code == 201
    # A due schedule of a user at the cap submits nothing (logged) and moves on to its next time.
    schedule = Schedule.objects.create(
        name="nightly",
        cron="0 3 * * *",
        kind=TEST_KIND,
        config={"steps": 1},
        owner=user,
        next_run_at=timezone.now() - timedelta(minutes=1),
    )
    assert schedules_submit_due() == []
    schedule.refresh_from_db()
    assert schedule.last_run is None and schedule.next_run_at > timezone.now()
    # The evaluation of a succeeded training run replaces it one for one: never refused by the caps.
    trained = Run.objects.create(
        name="t", origin="api", run_class="app", kind="rl_train", owner=user, status=RunStatus.SUCCEEDED
    )
    child = eval_run_submit(run=trained)
    assert child is not None and child.origin == "system" and child.status == RunStatus.QUEUED


@pytest.mark.django_db(transaction=True)
def test_concurrent_submits_cannot_pass_the_queued_cap(user, other_user, staff, handoffs):
    assert connection.vendor == "postgresql", "the race is tested against PostgreSQL"
    fill_the_cluster(other_user)
    set_limits(staff, max_queued_per_user=3)
    token = token_client("alice", "pw-alice")._credentials["HTTP_AUTHORIZATION"]
    clients = [APIClient() for _ in range(8)]  # one client per thread, one token (a script run 8 times at once)
    for client in clients:
        client.credentials(HTTP_AUTHORIZATION=token)
    barrier = threading.Barrier(len(clients))
    codes: list[int] = []

    def one(client: APIClient) -> None:
        try:
            barrier.wait(timeout=30)
            codes.append(submit(client).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(codes) == [201] * 3 + [429] * 5
    assert Run.objects.filter(owner=user, status=RunStatus.QUEUED).count() == 3
