"""Sign-in limits without lockout (issue 22): hammering `admin` from address A never stops `admin` signing in
from address B, via the token endpoint and the login page; A waits (429 with Retry-After), exponentially longer
after each further failure. Counted by django-axes in the real Redis; addresses are simulated through the
trusted-proxy setting (X-Forwarded-For with NUM_PROXIES=1), here only."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests.security.api_fixtures import (  # noqa: F401 (fixtures)
    _fast_password_hashing,
    _fresh_policy_cache,
    fresh_cache,
)

pytestmark = pytest.mark.django_db

A, B = "198.51.100.10", "203.0.113.20"
PROXY = "10.0.0.1"  # the one trusted proxy every request comes through


@pytest.fixture(autouse=True)
def behind_one_proxy(settings):
    settings.NUM_PROXIES = 1


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_superuser("admin", password="pw-admin-right")


def token(address: str, password: str, username: str = "admin"):
    return APIClient(REMOTE_ADDR=PROXY).post(
        "/api/auth/token/",
        {"username": username, "password": password},
        format="json",
        HTTP_X_FORWARDED_FOR=address,
    )


def login(address: str, password: str, username: str = "admin"):
    return Client(REMOTE_ADDR=PROXY).post(
        "/login/", {"username": username, "password": password}, HTTP_X_FORWARDED_FOR=address
    )


def test_fifty_wrong_passwords_from_a_leave_admin_signing_in_from_b(admin, settings):
    answers = [token(A, f"wrong-{i}").status_code for i in range(50)]
    limit = settings.AUTH_FAILURES_PER_USER_ADDRESS
    assert answers[:limit] == [400] * limit and set(answers[limit:]) == {429}
    refused = token(A, "pw-admin-right")  # A waits, even with the right password
    assert refused.status_code == 429 and 0 < int(refused["Retry-After"]) <= settings.AUTH_BACKOFF_SECONDS + 1
    assert "too many failed sign-ins" in refused.json()["detail"]

    signed_in = token(B, "pw-admin-right")  # at once, from another address
    assert signed_in.status_code == 200, signed_in.content
    assert APIClient(HTTP_AUTHORIZATION=f"Token {signed_in.json()['token']}").get("/api/runs/").status_code == 200
    page = login(B, "pw-admin-right")
    assert page.status_code == 302 and page.wsgi_request.session.get("_auth_user_id") == str(admin.pk)


def test_fifty_wrong_passwords_on_the_login_page_leave_admin_signing_in_from_b(admin):
    answers = [login(A, f"wrong-{i}").status_code for i in range(50)]
    assert answers[0] == 200 and answers[-1] == 429
    refused = login(A, "pw-admin-right")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert b"Too many failed sign-ins" in refused.content
    assert "_auth_user_id" not in refused.wsgi_request.session
    assert login(B, "pw-admin-right").status_code == 302
    assert token(B, "pw-admin-right").status_code == 200


def test_the_wait_doubles_with_each_failure_past_the_limit(admin, settings, monkeypatch):
    settings.AUTH_FAILURES_PER_USER_ADDRESS = 2
    settings.AUTH_BACKOFF_SECONDS = 60
    clock = [1_000_000.0]
    monkeypatch.setattr("runs.auth.auth_limit._now", lambda: clock[0])
    for _ in range(2):
        assert token(A, "wrong").status_code == 400
    waits = []
    for _ in range(4):
        refused = token(A, "wrong")
        assert refused.status_code == 429
        waits.append(int(refused["Retry-After"]))
        clock[0] += waits[-1]  # wait it out, then fail once more
        assert token(A, "wrong").status_code == 400
    assert waits == [61, 121, 241, 481]  # 60 s, doubled per further failure (+1: whole seconds, rounded up)


def test_the_wait_is_capped(admin, settings, monkeypatch):
    settings.AUTH_FAILURES_PER_USER_ADDRESS = 1
    settings.AUTH_BACKOFF_SECONDS = 60
    settings.AUTH_BACKOFF_MAX_SECONDS = 100
    clock = [1_000_000.0]
    monkeypatch.setattr("runs.auth.auth_limit._now", lambda: clock[0])
    for _ in range(3):
        assert token(A, "wrong").status_code == 400
        clock[0] += 101
    assert token(A, "wrong").status_code == 400
    assert int(token(A, "wrong")["Retry-After"]) == 101


def test_an_address_spraying_usernames_spends_its_own_budget(admin, django_user_model, settings):
    django_user_model.objects.create_user("bob", password="pw-bob-right")
    for i in range(settings.AUTH_FAILURES_PER_IP):
        assert token(A, "guess", username=f"user{i}").status_code == 400  # one try each: no pair reaches its limit
    assert token(A, "pw-bob-right", username="bob").status_code == 429
    assert token(B, "pw-bob-right", username="bob").status_code == 200


def test_a_correct_password_clears_the_pair_but_not_the_address(admin, settings):
    settings.AUTH_FAILURES_PER_IP = 6
    for _ in range(4):
        assert token(A, "wrong").status_code == 400
    assert token(A, "pw-admin-right").status_code == 200
    for _ in range(2):  # the pair starts again; the address has 6 failures
        assert token(A, "wrong").status_code == 400
    assert token(A, "pw-admin-right").status_code == 429
