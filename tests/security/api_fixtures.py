"""Fixtures of the API-level security tests (tokens, sign-in limits, bad input), imported by those modules only
(not a conftest: the browser and platform tests beside them create users for server processes, which must keep
the real password hashers): the API test kind and users, Celery hand-offs captured, fast password hashing, and a
cache namespace of each test's own (sign-in failure counters in the real Redis never leak between tests)."""

from __future__ import annotations

import secrets

import pytest
from rest_framework.test import APIClient

from tests.runs.helpers import (  # noqa: F401
    _fast_password_hashing,
    _fresh_policy_cache,
    handoffs,
    other_user,
    register_test_kind,
    staff,
    user,
)

register_test_kind()


@pytest.fixture(autouse=True)
def fresh_cache(settings, redis_url):
    """The real Redis cache, under a key prefix no other test uses."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis_url,
            "KEY_PREFIX": f"sec-{secrets.token_hex(6)}",
        }
    }
    yield


def client_for(user=None, **defaults) -> APIClient:
    client = APIClient(**defaults)
    if user is not None:
        client.force_authenticate(user)
    return client
