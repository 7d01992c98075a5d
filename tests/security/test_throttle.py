"""Sign-in limits on the token endpoint, the login page and the admin: repeated wrong passwords get 429 (counted
by django-axes in the real Redis, per username and client address and per client address); other users and the
same user from other addresses keep signing in. Backoff and the 50-failure case: test_signin_limits.py."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

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


@pytest.fixture(autouse=True)
def limits(settings):
    settings.AUTH_FAILURES_PER_USER_ADDRESS = 3
    settings.AUTH_FAILURES_PER_IP = 5
    settings.AUTH_BACKOFF_SECONDS = 600


@pytest.fixture
def users(django_user_model):
    for name in ("alice", "bob", "carol"):
        django_user_model.objects.create_user(name, password=f"pw-{name}")


def token(ip: str, username: str, password: str, **extra):
    return APIClient(REMOTE_ADDR=ip).post(
        "/api/auth/token/", {"username": username, "password": password}, format="json", **extra
    )


def login(ip: str, username: str, password: str, path: str = "/login/"):
    return Client(REMOTE_ADDR=ip).post(path, {"username": username, "password": password})


def test_token_endpoint_wrong_passwords_then_429(users):
    for _ in range(3):
        assert token("10.0.0.1", "alice", "wrong").status_code == 400
    blocked = token("10.0.0.1", "alice", "pw-alice")  # even the right password, while blocked
    assert blocked.status_code == 429, blocked.content
    assert 0 < int(blocked["Retry-After"]) <= 601
    assert "too many failed sign-ins" in blocked.json()["detail"]
    assert token("10.0.0.2", "alice", "pw-alice").status_code == 200  # the same user from elsewhere: fine
    assert token("10.0.0.2", "bob", "pw-bob").status_code == 200  # another user, another address: fine
    assert token("10.0.0.1", "bob", "pw-bob").status_code == 200  # the address is not blocked (3 < 5)


def test_token_endpoint_blocks_an_address_guessing_many_usernames(users):
    for i in range(5):
        assert token("10.0.1.1", f"nobody{i}", "guess").status_code == 400
    assert token("10.0.1.1", "carol", "pw-carol").status_code == 429
    assert token("10.0.1.2", "carol", "pw-carol").status_code == 200


def test_forwarded_for_does_not_pick_the_address(users):
    for i in range(5):
        assert token("10.0.2.1", f"nobody{i}", "guess", HTTP_X_FORWARDED_FOR=f"192.0.2.{i}").status_code == 400
    assert token("10.0.2.1", "carol", "pw-carol", HTTP_X_FORWARDED_FOR="192.0.2.99").status_code == 429


def test_forwarded_for_is_used_behind_trusted_proxies(users, settings):
    settings.NUM_PROXIES = 1
    for i in range(5):
        assert token("10.0.3.1", f"nobody{i}", "guess", HTTP_X_FORWARDED_FOR="198.51.100.7").status_code == 400
    assert token("10.0.3.1", "carol", "pw-carol", HTTP_X_FORWARDED_FOR="198.51.100.7").status_code == 429
    assert token("10.0.3.1", "carol", "pw-carol", HTTP_X_FORWARDED_FOR="198.51.100.8").status_code == 200


def test_a_correct_password_clears_the_username_count(users):
    for _ in range(2):
        assert token("10.0.4.1", "alice", "wrong").status_code == 400
    assert token("10.0.4.1", "alice", "pw-alice").status_code == 200
    for _ in range(2):
        assert token("10.0.4.2", "alice", "wrong").status_code == 400
    assert token("10.0.4.2", "alice", "pw-alice").status_code == 200


def test_login_page_wrong_passwords_then_429(users):
    for _ in range(3):
        page = login("10.0.5.1", "alice", "wrong")
        assert page.status_code == 200 and b"alert-error" in page.content
    blocked = login("10.0.5.1", "alice", "pw-alice")
    assert blocked.status_code == 429
    assert b"Too many failed sign-ins" in blocked.content and int(blocked["Retry-After"]) > 0
    assert "_auth_user_id" not in blocked.wsgi_request.session
    assert login("10.0.5.2", "bob", "pw-bob").status_code == 302  # another user, another address: logged in
    # The same counters guard the token endpoint; the user from another address signs in.
    assert token("10.0.5.1", "alice", "pw-alice").status_code == 429
    assert token("10.0.5.3", "alice", "pw-alice").status_code == 200


def test_admin_login_counts_and_is_refused_while_blocked(django_user_model):
    django_user_model.objects.create_superuser("root", password="pw-root")
    for _ in range(3):
        assert login("10.0.6.1", "root", "wrong", "/admin/login/").status_code == 200
    refused = login("10.0.6.1", "root", "pw-root", "/admin/login/")  # axes' backend and middleware
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert "_auth_user_id" not in refused.wsgi_request.session
    assert login("10.0.6.1", "root", "pw-root").status_code == 429
    assert login("10.0.6.2", "root", "pw-root", "/admin/login/").status_code == 302  # another address
