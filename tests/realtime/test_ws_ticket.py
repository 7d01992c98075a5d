"""Websocket tickets for API clients (runs/auth/ws_tickets.py, frontend/ws_ticket.py): a token user gets a one-use
ticket from POST /api/ws-ticket/ and follows their own run and the dashboard with it, no cookie and no Origin;
the same visibility and close codes as a session's socket; a used, unknown or expired ticket is refused; a
revoked token closes the socket at the next re-check; a browser session gets no ticket (it has its cookie)."""

from __future__ import annotations

import json
import time

import pytest
from channels.testing import WebsocketCommunicator
from knox.models import AuthToken
from rest_framework.test import APIClient

from runs.auth.tokens import token_issue
from tests.realtime.conftest import gate, run_async, run_make, user_make
from tests.realtime.test_consumers import WAIT, ingest

pytestmark = pytest.mark.django_db(transaction=True)


def ticket_for(token: str) -> str:
    answer = APIClient().post("/api/ws-ticket/", HTTP_AUTHORIZATION=f"Token {token}")
    assert answer.status_code == 201, answer.content
    assert set(answer.json()) == {"ticket", "expires_in"}
    return answer.json()["ticket"]


def by_ticket(path: str) -> WebsocketCommunicator:
    from config.asgi import application

    return WebsocketCommunicator(application, path, headers=[(b"host", b"localhost")])  # a script: no Origin


async def first_message(path: str) -> dict:
    comm = by_ticket(path)
    assert (await comm.connect(timeout=WAIT))[0]
    message = await comm.receive_output(timeout=WAIT)
    await comm.disconnect(timeout=WAIT)
    return message


def test_a_token_user_follows_their_run_once_per_ticket():
    owner = user_make("o")
    run = run_make(owner)
    ingest(run, [gate(1)])
    token = token_issue(owner)
    ticket = ticket_for(token)
    assert token not in ticket
    opened = run_async(first_message, f"/ws/runs/{run.pk}/?ticket={ticket}&after=0")
    assert opened["type"] == "websocket.send", opened
    snapshot = json.loads(opened["text"])
    assert snapshot["type"] == "snapshot" and snapshot["run"]["id"] == run.pk and snapshot["last_seq"] == 1
    used = run_async(first_message, f"/ws/runs/{run.pk}/?ticket={ticket}")
    assert used == {"type": "websocket.close", "code": 4401}
    dashboard = run_async(first_message, f"/ws/dashboard/?ticket={ticket_for(token)}")
    assert dashboard["type"] == "websocket.send", dashboard


def test_visibility_and_refusals_are_a_sessions():
    owner, other = user_make("o"), user_make("x")
    run = run_make(owner)
    theirs = ticket_for(token_issue(other))
    assert run_async(first_message, f"/ws/runs/{run.pk}/?ticket={theirs}") == {"type": "websocket.close", "code": 4403}
    # Issue 27: a token client opening a missing run gets the same 4403 as for another user's run (no id leaks).
    missing = ticket_for(token_issue(other))
    closed = run_async(first_message, f"/ws/runs/{run.pk + 1000}/?ticket={missing}")
    assert closed == {"type": "websocket.close", "code": 4403}
    for bad in ("", "nope", "x" * 500):
        assert run_async(first_message, f"/ws/runs/{run.pk}/?ticket={bad}") == {"type": "websocket.close", "code": 4401}


def test_an_expired_ticket_is_refused(settings):
    settings.WS_TICKET_SECONDS = 1
    owner = user_make("o")
    run = run_make(owner)
    ticket = ticket_for(token_issue(owner))
    time.sleep(1.5)
    assert run_async(first_message, f"/ws/runs/{run.pk}/?ticket={ticket}") == {"type": "websocket.close", "code": 4401}


def test_a_revoked_token_closes_its_socket_at_the_next_recheck(settings):
    settings.WS_SESSION_RECHECK_SECONDS = 0.3
    owner = user_make("o")
    run = run_make(owner)
    token = token_issue(owner)
    ticket = ticket_for(token)

    async def scenario() -> dict:
        from asgiref.sync import sync_to_async

        comm = by_ticket(f"/ws/runs/{run.pk}/?ticket={ticket}")
        assert (await comm.connect(timeout=WAIT))[0]
        assert (await comm.receive_json_from(timeout=WAIT))["type"] == "snapshot"
        await sync_to_async(AuthToken.objects.filter(user=owner).delete)()
        return await comm.receive_output(timeout=WAIT)

    assert run_async(scenario) == {"type": "websocket.close", "code": 4401}


def test_a_session_or_no_credential_gets_no_ticket():
    owner = user_make("o")
    session = APIClient()
    session.force_login(owner)
    assert session.post("/api/ws-ticket/").status_code == 401
    assert APIClient().post("/api/ws-ticket/").status_code == 401
