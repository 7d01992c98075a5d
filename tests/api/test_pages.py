"""Server-rendered pages: login/logout and the staff concurrency settings form (no JavaScript involved)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from runs.slots import store

pytestmark = pytest.mark.django_db


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def field_error(html: str, name: str) -> str:
    """The error text rendered in the same cell/field as input `name`."""
    match = re.search(rf'name="{name}"[^>]*>(?:(?!</td>|</div>).)*?<span class="error"[^>]*>([^<]+)</span>', html, re.S)
    return match.group(1) if match else ""


def test_login_and_logout(user):
    client = Client()
    assert client.get("/login/").status_code == 200
    bad = client.post("/login/", {"username": "alice", "password": "wrong"})
    assert bad.status_code == 200 and "alert" in bad.content.decode()
    ok = client.post("/login/", {"username": "alice", "password": "pw-alice"})
    assert ok.status_code == 302
    assert client.get("/api/slots/").status_code == 200
    assert client.post("/logout/").status_code == 302
    assert client.get("/api/slots/").status_code in (401, 403)


def test_settings_page_access(user, staff):
    assert Client().get("/settings/").status_code == 302  # to the login page
    assert logged_in(user).get("/settings/").status_code == 403
    assert logged_in(user).post("/settings/", {"max_total": "9"}).status_code == 403
    page = logged_in(staff).get("/settings/")
    html = page.content.decode()
    assert page.status_code == 200
    assert 'data-testid="effective-reserve">1<' in html and 'data-testid="effective-borrowable">3<' in html
    assert 'name="app_limit"' in html and "default 3" in html and "Running now: 0 of 4" in html


def test_settings_form_saves_and_blank_means_default(staff):
    client = logged_in(staff)
    saved = client.post(
        "/settings/", {"max_total": "8", "interactive_reserve": "", "system_limit": "2", "app_priority": "35"}
    )
    assert saved.status_code == 302
    assert store.policy_stored_raw() == {"max_total": 8, "classes": {"system": {"limit": 2}, "app": {"priority": 35}}}
    html = client.get("/settings/").content.decode()
    assert 'value="8"' in html and 'data-testid="effective-reserve">2<' in html


def test_settings_form_gpu_limit(staff):
    client = logged_in(staff)
    assert client.post("/settings/", {"max_total": "4", "app_gpu_limit": "2"}).status_code == 302
    assert store.policy_stored_raw()["classes"] == {"app": {"gpu_limit": 2}}
    html = client.get("/settings/").content.decode()
    assert 'name="app_gpu_limit"' in html and 'value="2"' in html and "GPUs 2" in html and "GPUs no limit" in html


@pytest.mark.parametrize(
    "form,field,fragment",
    [
        ({"max_total": "0"}, "max_total", "from 1 to 1000"),
        ({"max_total": "abc"}, "max_total", "whole number"),
        ({"max_total": "4", "interactive_reserve": "4"}, "interactive_reserve", "must be below max_total"),
        ({"app_limit": "0"}, "app_limit", "from 1 to 1000"),
        ({"system_priority": "101"}, "system_priority", "from 0 to 100"),
        ({"app_gpu_limit": "-1"}, "app_gpu_limit", "from 0 to 1000"),
        ({"app_gpu_limit": "x"}, "app_gpu_limit", "whole number"),
        ({"app_max_running_per_user": "0"}, "app_max_running_per_user", "from 1 to 1000"),
        ({"system_aging_cap": "101"}, "system_aging_cap", "from 0 to 100"),
        ({"fair_share_half_life_seconds": "0"}, "fair_share_half_life_seconds", "from 1 to"),
        ({"preempt_grace_seconds": "0"}, "preempt_grace_seconds", "from 1 to 3600"),
        ({"max_preemptions_per_run_per_day": "x"}, "max_preemptions_per_run_per_day", "whole number"),
    ],
)
def test_settings_form_errors_beside_fields(staff, form, field, fragment):
    answer = logged_in(staff).post("/settings/", form)
    assert answer.status_code == 400
    assert fragment in field_error(answer.content.decode(), field)
    assert store.policy_stored_raw() == {}


def test_settings_form_fairness_round_trip_keeps_api_weights(staff):
    from runs.scheduling.concurrency import settings_update

    settings_update(changes={"user_weights": {"7": 3}}, partial=True, by=None)
    client = logged_in(staff)
    form = {"max_total": "4", "app_fair_share": "on", "app_max_running_per_user": "2", "system_aging_per_hour": "5"}
    form |= {"system_aging_cap": "10", "schedule_max_wait_seconds": "600", "fair_share_half_life_seconds": "60"}
    assert client.post("/settings/", form).status_code == 302
    raw = store.policy_stored_raw()
    assert raw["classes"] == {
        "app": {"fair_share": True, "max_running_per_user": 2},
        "system": {"aging_per_hour": 5, "aging_cap": 10},
        "schedule": {"max_wait_seconds": 600},
    }
    assert raw["fair_share_half_life_seconds"] == 60 and raw["user_weights"] == {"7": 3}
    html = client.get("/settings/").content.decode()
    assert (
        'name="app_fair_share" checked' in html and 'id="schedule_max_wait_seconds"' in html and 'value="600"' in html
    )
    assert client.post("/settings/", {"max_total": "4"}).status_code == 302  # unticked: fair share off again
    assert store.policy_stored_raw()["classes"] == {} and store.policy_stored_raw()["user_weights"] == {"7": 3}


def test_settings_form_preemption_round_trip(staff):
    client = logged_in(staff)
    form = {"max_total": "4", "interactive_preempts": "on", "schedule_preemptible": "on"}
    form |= {"preempt_grace_seconds": "45", "max_preemptions_per_run_per_day": "2"}
    assert client.post("/settings/", form).status_code == 302
    raw = store.policy_stored_raw()
    assert raw["classes"] == {"interactive": {"preempts": True}, "schedule": {"preemptible": True}}
    assert (raw["preempt_grace_seconds"], raw["max_preemptions_per_run_per_day"]) == (45, 2)
    html = client.get("/settings/").content.decode()
    assert 'name="interactive_preempts" checked' in html and 'name="schedule_preemptible" checked' in html
    assert 'name="app_preempts">' in html and "in effect 45" in html
    assert client.post("/settings/", {"max_total": "4"}).status_code == 302  # unticked, blank: off again
    raw = store.policy_stored_raw()
    assert raw["classes"] == {} and "preempt_grace_seconds" not in raw
