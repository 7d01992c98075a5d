"""The webhook API as its users and as an attacker: create (secret shown once), list, patch, delete, "send test"
and the delivery log, each only for the subscription's owner; scope checks (another user's run, staff-only
fields); bad input is a 400 naming the field; the per-user count is capped."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runs.models import Run
from runs.webhooks.models import Delivery, Subscription
from runs.webhooks.tasks import deliver_once
from tests.webhooks.receiver import signature_valid

pytestmark = pytest.mark.django_db


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def run_of(owner) -> Run:
    return Run.objects.create(name="r", origin="api", run_class="app", kind="rl_train", owner=owner, status="running")


def test_create_shows_the_secret_once_and_the_owner_manages_it(user, receiver, private_ok, handed):
    api = client_for(user)
    made = api.post("/api/webhooks/", {"url": receiver.url, "events": ["run.status", "run.preempted"]}, format="json")
    assert made.status_code == 201, made.content
    body = made.json()
    assert len(body["secret"]) == 64 and body["events"] == ["run.preempted", "run.status"]
    sub_id = body["id"]
    listed = api.get("/api/webhooks/").json()
    assert [s["id"] for s in listed] == [sub_id] and "secret" not in listed[0]
    assert "secret" not in api.get(f"/api/webhooks/{sub_id}/").json()
    patched = api.patch(f"/api/webhooks/{sub_id}/", {"active": False, "events": ["run.checkpoint"]}, format="json")
    assert patched.status_code == 200 and patched.json()["active"] is False
    assert patched.json()["events"] == ["run.checkpoint"]
    bad = api.patch(f"/api/webhooks/{sub_id}/", {"secret": "mine"}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "secret"
    assert api.delete(f"/api/webhooks/{sub_id}/").status_code == 204
    assert not Subscription.objects.exists()


def test_send_test_is_signed_and_logged(user, receiver, private_ok, handed, django_capture_on_commit_callbacks):
    api = client_for(user)
    made = api.post("/api/webhooks/", {"url": receiver.url, "events": ["run.status"]}, format="json").json()
    with django_capture_on_commit_callbacks(execute=True):
        sent = api.post(f"/api/webhooks/{made['id']}/test/")
    assert sent.status_code == 202, sent.content
    assert handed == [sent.json()["id"]]
    assert deliver_once(handed[0]) == ("delivered", 1)
    [request] = receiver.accepted()
    assert request["headers"]["X-RLCP-Delivery"] == handed[0]
    assert signature_valid(request, made["secret"])
    log = api.get(f"/api/webhooks/{made['id']}/deliveries/").json()
    assert log[0]["state"] == "delivered" and log[0]["attempt_log"][0]["status_code"] == 204
    assert log[0]["attempt_log"][0]["latency_ms"] >= 0


def test_another_user_sees_tests_and_changes_nothing(user, other_user, receiver, private_ok, handed):
    made = client_for(user).post("/api/webhooks/", {"url": receiver.url, "events": ["run.status"]}, format="json")
    sub_id = made.json()["id"]
    bob = client_for(other_user)
    assert bob.get("/api/webhooks/").json() == []
    for method, path in [
        ("get", f"/api/webhooks/{sub_id}/"),
        ("patch", f"/api/webhooks/{sub_id}/"),
        ("delete", f"/api/webhooks/{sub_id}/"),
        ("post", f"/api/webhooks/{sub_id}/test/"),
        ("get", f"/api/webhooks/{sub_id}/deliveries/"),
    ]:
        answer = getattr(bob, method)(path, {"active": False} if method == "patch" else None, format="json")
        assert answer.status_code == 404, (method, path, answer.content)
    assert not Delivery.objects.exists() and handed == []
    assert Subscription.objects.get(pk=sub_id).active
    assert APIClient().get("/api/webhooks/").status_code in (401, 403)


def test_a_user_subscribes_only_to_their_own_runs(user, other_user, staff, receiver, private_ok):
    theirs = run_of(other_user)
    api = client_for(user)
    for body, field in [
        ({"run": theirs.pk}, "run"),
        ({"run": 10**9}, "run"),
        ({"run": "1; drop"}, "run"),
        ({"all_runs": True}, "all_runs"),
        ({"allow_private": True}, "allow_private"),
    ]:
        answer = api.post("/api/webhooks/", {"url": receiver.url, "events": ["run.status"], **body}, format="json")
        assert answer.status_code in (400, 403) and answer.json()["field"] == field, (body, answer.content)
    mine = api.post(
        "/api/webhooks/", {"url": receiver.url, "events": ["run.status"], "run": run_of(user).pk}, format="json"
    )
    assert mine.status_code == 201
    staff_one = client_for(staff).post(
        "/api/webhooks/", {"url": receiver.url, "events": ["run.status"], "all_runs": True}, format="json"
    )
    assert staff_one.status_code == 201 and staff_one.json()["all_runs"] is True


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"events": []}, "events"),
        ({"events": ["run.nope"]}, "events"),
        ({"events": "run.status"}, "events"),
        ({"rules": [{"metric": "loss", "op": "above", "threshold": 1}]}, "rules[0].metric"),
        ({"rules": [{"metric": "exact_match", "op": "near", "threshold": 1}]}, "rules[0].op"),
        ({"rules": [{"metric": "exact_match", "op": "above", "threshold": "x"}]}, "rules[0].threshold"),
        ({"rules": [{"metric": "exact_match", "op": "drop", "threshold": 5, "window": 3}]}, "rules[0].threshold"),
        ({"rules": [{"metric": "exact_match", "op": "drop", "threshold": 0.2, "window": 10**6}]}, "rules[0].window"),
        ({"rules": [{"metric": "exact_match", "op": "above", "threshold": 1}] * 11}, "rules"),
        ({"url": "http://example.com/" + "a" * 3000}, "url"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(user, receiver, private_ok, body, field):
    answer = client_for(user).post(
        "/api/webhooks/", {"url": receiver.url, "events": ["run.status"], **body}, format="json"
    )
    assert answer.status_code == 400, answer.content
    assert answer.json()["field"] == field


def test_a_subscription_with_rules_may_take_no_events(user, receiver, private_ok):
    api = client_for(user)
    rule = {"metric": "reward_mean", "op": "drop", "threshold": 0.3, "window": 5}
    made = api.post("/api/webhooks/", {"url": receiver.url, "events": [], "rules": [rule]}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["events"] == [] and made.json()["rules"] == [rule | {"threshold": 0.3}]
    no_rules = api.patch(f"/api/webhooks/{made.json()['id']}/", {"events": [], "rules": []}, format="json")
    assert no_rules.status_code == 400 and no_rules.json()["field"] == "events"


def test_the_count_per_user_is_capped(user, receiver, private_ok, settings):
    settings.WEBHOOKS_MAX_PER_USER = 2
    api = client_for(user)
    codes = [
        api.post("/api/webhooks/", {"url": receiver.url, "events": ["run.status"]}, format="json").status_code
        for _ in range(3)
    ]
    assert codes == [201, 201, 429]
