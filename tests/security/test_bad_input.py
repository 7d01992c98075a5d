"""Crashes are not responses: hostile input answers 400 naming the field, never a 500 (real PostgreSQL).

Each case once crashed a view: `int()` of a non-ASCII digit, RecursionError in the JSON decoder, datetime out of
range, psycopg refusing to encode a lone surrogate (PostgreSQL refusing NUL), croniter never finding a date."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from runs.models import Run, RunEvent, Schedule
from tests.runs.helpers import TEST_KIND
from tests.security.api_fixtures import (  # noqa: F401 (fixtures)
    _fast_password_hashing,
    _fresh_policy_cache,
    client_for,
    fresh_cache,
    handoffs,
    other_user,
    staff,
    user,
)

pytestmark = pytest.mark.django_db

DEEP = "[" * 100_000


def raw_post(client, url, body: str, method: str = "post", **extra):
    return getattr(client, method)(
        url, data=body.encode("utf-8", "surrogatepass"), content_type="application/json", **extra
    )


def assert_400(response, field):
    assert response.status_code == 400, (response.status_code, response.content[:300])
    body = response.json()
    assert body["field"] == field, body
    assert body["detail"], body
    return body


@pytest.mark.parametrize("after", ["١٢", "²", "12٣", "99999999999999999999", "-1", "1e3", " 1"])
def test_events_after_must_be_ascii_digits(user, after):
    run = Run.objects.create(name="r", origin="api", run_class="app", kind=TEST_KIND, owner=user)
    response = client_for(user).get(f"/api/runs/{run.pk}/events/", {"after": after})
    assert_400(response, "after")


@pytest.mark.parametrize(
    "method,url,auth",
    [
        ("post", "/api/auth/token/", False),
        ("post", "/api/runs/", True),
        ("post", "/api/slots/dry-run/", True),
        ("put", "/api/settings/concurrency/", "staff"),
        ("patch", "/api/settings/concurrency/", "staff"),
        ("post", "/api/schedules/", "staff"),
    ],
)
def test_deeply_nested_json_is_refused_naming_body(user, staff, method, url, auth):
    client = client_for(staff if auth == "staff" else user if auth else None)
    # The token endpoint reads at most 16 KiB (past it, 413: test_body_limits.py); 10,000 levels still pass the
    # recursion limit.
    assert_400(raw_post(client, url, DEEP if auth else DEEP[:10_000], method=method), "body")
    # Deep, yet within the recursion limit: refused by the parser's own depth limit.
    assert_400(raw_post(client, url, '{"name": ' + "[" * 200 + "]" * 200 + "}", method=method), "body")


def test_deeply_nested_json_on_ingest_is_refused(user):
    run = Run.objects.create(name="r", origin="api", run_class="app", kind="rl_train", owner=user, status="running")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {run.ingest_token}"}
    assert_400(raw_post(APIClient(), f"/api/runs/{run.pk}/ingest/", DEEP, **auth), "body")
    nested = {"seq": 1, "type": "log", "data": {"x": json.loads("[" * 100 + "]" * 100)}}
    assert_400(APIClient().post(f"/api/runs/{run.pk}/ingest/", [nested], format="json", **auth), "body")


@pytest.mark.parametrize(
    "event,field",
    [
        ({"seq": 1, "type": "log", "ts": 253402300800}, "events[0].ts"),  # 10000-01-01
        ({"seq": 1, "type": "log", "ts": 1e300}, "events[0].ts"),
        ({"seq": 1, "type": "log", "ts": -1}, "events[0].ts"),
        ({"seq": 2**64, "type": "log"}, "events[0].seq"),
        ({"seq": 2**63, "type": "log"}, "events[0].seq"),
    ],
)
def test_ingest_ts_and_seq_out_of_range(user, event, field):
    run = Run.objects.create(name="r", origin="api", run_class="app", kind="rl_train", owner=user, status="running")
    response = APIClient().post(
        f"/api/runs/{run.pk}/ingest/", [event], format="json", HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}"
    )
    body = assert_400(response, field)
    assert ("ts:" in body["detail"]) != ("seq:" in body["detail"])
    assert not RunEvent.objects.filter(run=run).exists()


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_ingest_ts_not_finite(user, literal):
    run = Run.objects.create(name="r", origin="api", run_class="app", kind="rl_train", owner=user, status="running")
    response = raw_post(
        APIClient(),
        f"/api/runs/{run.pk}/ingest/",
        f'[{{"seq": 1, "type": "log", "ts": {literal}}}]',
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )
    # NaN/Infinity are not JSON (refused by the parser); 1e999 is JSON and decodes to inf (refused as ts).
    assert_400(response, "events[0].ts" if literal == "1e999" else "body")
    assert not RunEvent.objects.filter(run=run).exists()


@pytest.mark.parametrize("bad", ["\\ud800", "x\\udfffy", "\\u0000", "a\\u0000b"])
def test_lone_surrogates_and_nul_in_run_submit(user, handoffs, bad):
    client = client_for(user)
    assert_400(raw_post(client, "/api/runs/", f'{{"name": "{bad}", "kind": "{TEST_KIND}"}}'), "name")
    body = f'{{"name": "ok", "kind": "{TEST_KIND}", "config": {{"steps": 1, "note": {{"deep": ["{bad}"]}}}}}}'
    assert_400(raw_post(client, "/api/runs/", body), "config.note.deep[0]")
    assert_400(raw_post(client, "/api/runs/", f'{{"name": "ok", "config": {{"{bad}": 1}}}}'), "config")
    assert not Run.objects.exists()


@pytest.mark.parametrize("bad", ["\\ud800", "\\u0000"])
def test_lone_surrogates_and_nul_in_event_data_and_schedules(user, staff, bad):
    run = Run.objects.create(name="r", origin="api", run_class="app", kind="rl_train", owner=user, status="running")
    response = raw_post(
        APIClient(),
        f"/api/runs/{run.pk}/ingest/",
        f'[{{"seq": 1, "type": "log", "data": {{"msg": "{bad}"}}}}]',
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )
    assert_400(response, "[0].data.msg")
    assert_400(
        raw_post(
            client_for(staff), "/api/schedules/", f'{{"name": "{bad}", "cron": "0 3 * * *", "kind": "{TEST_KIND}"}}'
        ),
        "name",
    )
    assert_400(raw_post(APIClient(), "/api/auth/token/", f'{{"username": "{bad}", "password": "x"}}'), "username")


@pytest.mark.parametrize(
    "cron", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4 *", "* * * * * *", "0 3 * * * 2099", "0 3 * *", "@daily", "", "   "]
)
def test_schedule_cron_must_be_five_fields_that_fire(staff, cron):
    client = client_for(staff)
    created = client.post("/api/schedules/", {"name": "s", "cron": cron, "kind": TEST_KIND}, format="json")
    assert_400(created, "cron")
    ok = client.post("/api/schedules/", {"name": "s", "cron": "0 3 * * *", "kind": TEST_KIND}, format="json")
    assert ok.status_code == 201, ok.content
    patched = client.patch(f"/api/schedules/{ok.json()['id']}/", {"cron": cron}, format="json")
    assert_400(patched, "cron")
    assert Schedule.objects.get().cron == "0 3 * * *"


def test_a_stored_cron_that_never_fires_disables_its_schedule_instead_of_crashing_the_tick(staff):
    from django.utils import timezone

    from runs.execution.schedules import schedules_submit_due

    schedule = Schedule.objects.create(
        name="s", cron="0 0 31 2 *", kind=TEST_KIND, owner=staff, next_run_at=timezone.now()
    )
    assert schedules_submit_due() == []
    schedule.refresh_from_db()
    assert schedule.enabled is False
