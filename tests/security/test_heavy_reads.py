"""Heavy reads (trace, compare, slot dry-run, priority, samples) are throttled per user: past the scope's rate a
user gets 429 with Retry-After while another user is still served, counted in the real Redis cache. And they run off the
event loop: each is a sync view, which Django's ASGI handler runs in a worker thread (no async view, nothing
of theirs on the loop)."""

from __future__ import annotations

import asyncio

import pytest
from django.urls import resolve

from runs.api.throttles import DEFAULT_RATES, heavy_read_rate
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

RATE = 3


def run_of(owner) -> int:
    from runs.models import Run

    return Run.objects.create(owner=owner, name="r", origin="api", kind="rl_train", config={"steps": 1}).pk


def requests_of(scope: str, run_id: int, owner):
    """One request of the scope, as a function of a client. A websocket ticket is for API tokens only, so that
    request goes from a client of its own with the owner's token (a forced sign-in is not a token)."""
    if scope == "ws_ticket":
        from runs.auth.tokens import token_issue

        token = token_issue(owner)
        return lambda _c: client_for().post("/api/ws-ticket/", HTTP_AUTHORIZATION=f"Token {token}")
    return {
        "trace": lambda c: c.get(f"/api/runs/{run_id}/trace/"),
        "compare": lambda c: c.get("/api/runs/compare/", {"runs": str(run_id)}),
        "dry_run": lambda c: c.post("/api/slots/dry-run/", {"origin": "api"}, format="json"),
        "samples": lambda c: c.get(f"/api/runs/{run_id}/samples/"),
        "priority": lambda c: c.get(f"/api/runs/{run_id}/priority/"),
        "webhooks": lambda c: c.get("/api/webhooks/"),
    }[scope]


# `agents` (the proxy to a run's session server) has its own test: tests/api/test_agent_proxy.py.
@pytest.mark.parametrize("scope", sorted(set(DEFAULT_RATES) - {"agents"}))
def test_past_the_rate_a_user_gets_429_with_retry_after_and_others_do_not(scope, user, other_user, settings):
    settings.HEAVY_READ_THROTTLE_RATES = {scope: f"{RATE}/min"}
    ask = requests_of(scope, run_of(user), user)
    mine = client_for(user)
    for _ in range(RATE):
        answer = ask(mine)
        assert answer.status_code in (200, 201), (scope, answer.status_code, answer.content[:300])
    refused = ask(mine)
    assert refused.status_code == 429, (scope, refused.content[:300])
    assert 0 < int(refused["Retry-After"]) <= 60
    assert "throttled" in refused.json()["detail"]
    # Another user is counted apart (their own run for the run-scoped reads: a 404 is not a 429 either way).
    theirs = client_for(other_user)
    assert requests_of(scope, run_of(other_user), other_user)(theirs).status_code in (200, 201)


def test_samples_list_and_detail_share_one_count(user, settings):
    settings.HEAVY_READ_THROTTLE_RATES = {"samples": "2/min"}
    run_id = run_of(user)
    client = client_for(user)
    assert client.get(f"/api/runs/{run_id}/samples/").status_code == 200
    assert client.get(f"/api/runs/{run_id}/samples/1/").status_code == 404  # counted, no such sample
    assert client.get(f"/api/runs/{run_id}/samples/").status_code == 429


def test_rates_come_from_settings_with_defaults(settings):
    settings.HEAVY_READ_THROTTLE_RATES = {"trace": "1/hour"}
    assert (heavy_read_rate("trace"), heavy_read_rate("compare")) == ("1/hour", DEFAULT_RATES["compare"])


@pytest.mark.parametrize(
    "path", ["/api/runs/1/trace/", "/api/runs/compare/", "/api/slots/dry-run/", "/api/runs/1/samples/"]
)
def test_heavy_reads_are_sync_views_so_asgi_runs_them_in_a_thread(path):
    view = resolve(path).func
    assert not asyncio.iscoroutinefunction(view), path
    assert not getattr(view, "view_is_async", False), path
