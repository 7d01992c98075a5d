"""Websocket limits through config.asgi.application (WebsocketCommunicator, real Redis and PostgreSQL): the
per-user cap on open sockets, closing on logout, on loss of staff and on a session that no longer exists,
paged replay on connect and the paged REST events endpoint (issue 9, points 2 and 4)."""

from __future__ import annotations

import json
import time

import pytest
from asgiref.sync import sync_to_async
from django.contrib.sessions.models import Session
from django.test import Client

from frontend import ws_guard
from runs.models import Run
from runs.telemetry.ingest import run_events_ingest
from tests.realtime.conftest import communicator, isolated_layer, run_async, run_make, train, user_make  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
WAIT = 30


async def opened(path: str, user) -> tuple:
    """Connect and read the first message: ("open", comm, snapshot) or ("closed", comm, close code)."""
    comm = communicator(path, user)
    assert (await comm.connect(timeout=WAIT))[0]
    first = await comm.receive_output(timeout=WAIT)
    if first["type"] == "websocket.close":
        return "closed", comm, first["code"]
    return "open", comm, json.loads(first["text"])


async def close_code_soon(comm, timeout: float = WAIT) -> int:
    """The close code of an open socket, skipping data frames that were already on their way."""
    deadline = time.monotonic() + timeout
    while True:
        message = await comm.receive_output(timeout=max(0.1, deadline - time.monotonic()))
        if message["type"] == "websocket.close":
            return message["code"]


def test_sockets_per_user_are_capped_across_processes(settings) -> None:
    settings.WS_MAX_PER_USER = 3
    alice, bob = user_make("alice"), user_make("bob")
    run = run_make(alice)

    async def scenario():
        socks = []
        for path in ["/ws/dashboard/", f"/ws/runs/{run.pk}/", "/ws/dashboard/"]:
            state, comm, _ = await opened(path, alice)
            assert state == "open"
            socks.append(comm)
        state, extra, code = await opened("/ws/dashboard/", alice)
        assert (state, code) == ("closed", 4429)
        await extra.disconnect()
        state, other, _ = await opened("/ws/dashboard/", bob)  # the cap is per user
        assert state == "open"
        await other.disconnect()
        await socks.pop().disconnect()  # a closed socket frees its place
        state, again, _ = await opened(f"/ws/runs/{run.pk}/", alice)
        assert state == "open"
        # Another ASGI process counts in the same place (Redis), so this process sees the user at the cap.
        await sync_to_async(ws_guard.presence_acquire)(alice.pk, "another-process!channel")
        state, refused, code = await opened("/ws/dashboard/", alice)
        assert (state, code) == ("closed", 4429)
        for comm in [*socks, again, refused]:
            await comm.disconnect()

    run_async(scenario)


def test_logout_closes_that_sessions_sockets_at_once() -> None:
    alice = user_make("alice")
    run = run_make(alice)

    def logout() -> None:
        client = Client()
        client.cookies["sessionid"] = alice.cookie
        assert client.post("/logout/").status_code == 302

    async def scenario():
        state, run_sock, _ = await opened(f"/ws/runs/{run.pk}/", alice)
        state2, board, _ = await opened("/ws/dashboard/", alice)
        assert state == state2 == "open"
        await sync_to_async(logout)()
        assert await close_code_soon(run_sock, timeout=10) == 4401
        assert await close_code_soon(board, timeout=10) == 4401
        await run_sock.disconnect()
        await board.disconnect()

    run_async(scenario)


def test_losing_staff_closes_streams_of_other_peoples_runs() -> None:
    alice, boss = user_make("alice"), user_make("boss", staff=True)
    run = run_make(alice)

    def demote() -> None:
        boss.is_staff = False
        boss.save()

    async def scenario():
        state, run_sock, _ = await opened(f"/ws/runs/{run.pk}/", boss)
        state2, board, _ = await opened("/ws/dashboard/", boss)
        assert state == state2 == "open"
        await sync_to_async(demote)()
        assert await close_code_soon(run_sock, timeout=10) == 4403
        assert await close_code_soon(board, timeout=10) == 4403
        await run_sock.disconnect()
        await board.disconnect()
        # Reconnecting: the run is refused like a missing one (4403), the board comes back with the rights the
        # user has now.
        state, refused, code = await opened(f"/ws/runs/{run.pk}/", boss)
        assert (state, code) == ("closed", 4403)
        state, board, snap = await opened("/ws/dashboard/", boss)
        assert state == "open" and snap["active"] == []
        await refused.disconnect()
        await board.disconnect()

    run_async(scenario)


def test_another_users_run_and_a_missing_run_close_alike() -> None:
    """Issue 22, point 7: the socket's answer does not tell another user's run from a run id that does not
    exist (same close code, nothing sent before it), with or without `after`."""
    alice, mallory = user_make("alice"), user_make("mallory")
    run = run_make(alice)
    missing = Run.objects.order_by("-pk").first().pk + 1000

    async def scenario():
        answers = []
        for run_id in (run.pk, missing):
            for query in ("", "?after=0"):
                state, comm, code = await opened(f"/ws/runs/{run_id}/{query}", mallory)
                answers.append((state, code))
                await comm.disconnect()
        assert answers == [("closed", 4403)] * 4, answers

    run_async(scenario)


def test_a_session_that_is_gone_is_noticed_by_the_periodic_recheck(settings) -> None:
    settings.WS_SESSION_RECHECK_SECONDS = 0.3
    alice = user_make("alice")
    run = run_make(alice)

    async def scenario():
        state, sock, _ = await opened(f"/ws/runs/{run.pk}/", alice)
        assert state == "open"
        # Deleted behind Django's back (admin, session cleanup, expiry): no signal, only the re-check sees it.
        await sync_to_async(lambda: Session.objects.filter(session_key=alice.cookie).delete())()
        assert await close_code_soon(sock, timeout=10) == 4401
        await sock.disconnect()

    run_async(scenario)


def test_replay_on_connect_is_paged_and_points_at_the_rest_api(settings) -> None:
    settings.WS_REPLAY_MAX = 5
    alice = user_make("alice")
    run = run_make(alice)
    run_events_ingest(run=Run.objects.get(pk=run.pk), payload=[train(i, i) for i in range(1, 13)])

    async def scenario():
        state, sock, snap = await opened(f"/ws/runs/{run.pk}/?after=0", alice)
        assert state == "open" and snap["last_seq"] == 12
        assert await sock.receive_json_from(timeout=WAIT) == {"type": "truncated", "after": 0, "through": 7}
        seqs: list[int] = []
        while not seqs or seqs[-1] < 12:
            message = await sock.receive_json_from(timeout=WAIT)
            assert message["type"] == "events"
            seqs += [e["seq"] for e in message["events"]]
        assert seqs == [8, 9, 10, 11, 12]
        await sock.disconnect()
        # Close enough behind: exactly the missed events, no truncation message.
        state, near, _ = await opened(f"/ws/runs/{run.pk}/?after=9", alice)
        message = await near.receive_json_from(timeout=WAIT)
        assert [e["seq"] for e in message["events"]] == [10, 11, 12]
        await near.disconnect()

    run_async(scenario)


def test_rest_events_are_paged_with_a_maximum_page_size(settings) -> None:
    settings.EVENTS_PAGE_MAX = 4
    alice = user_make("alice")
    run = run_make(alice)
    run_events_ingest(run=Run.objects.get(pk=run.pk), payload=[train(i, i) for i in range(1, 11)])
    client = Client()
    client.force_login(alice)
    url = f"/api/runs/{run.pk}/events/"
    first = client.get(url, {"after": 0})
    assert [e["seq"] for e in first.json()] == [1, 2, 3, 4]  # the default page is the maximum
    assert first["Link"] == f'</api/runs/{run.pk}/events/?after=4&limit=4>; rel="next"'
    page = client.get(url, {"after": 4, "limit": 3})
    assert [e["seq"] for e in page.json()] == [5, 6, 7]
    last = client.get(url, {"after": 8, "limit": 4})
    assert [e["seq"] for e in last.json()] == [9, 10] and "Link" not in last
    for bad in ["0", "5", "-1", "x", "99999999999999999999", "٣"]:
        response = client.get(url, {"after": 0, "limit": bad})
        assert response.status_code == 400 and response.json()["field"] == "limit", bad


def test_hostile_after_on_a_run_socket_is_a_clean_refusal() -> None:
    """`?after=` takes ASCII digits within 64 bits, like the REST endpoint: a Unicode digit (which int()
    would read as 1, a valid seq here), 10**30 and query bytes that are not UTF-8 close the socket with 4400
    (bad request) instead of replaying from a misread seq or crashing."""
    alice = user_make("alice")
    run = run_make(alice)
    run_events_ingest(run=Run.objects.get(pk=run.pk), payload=[train(i, i) for i in range(1, 4)])

    async def refused(query: bytes) -> int:
        comm = communicator(f"/ws/runs/{run.pk}/", alice)
        comm.scope["query_string"] = query  # raw bytes, as a client may send them
        assert (await comm.connect(timeout=WAIT))[0]
        first = await comm.receive_output(timeout=WAIT)
        await comm.disconnect()
        return first.get("code", first["type"])

    async def scenario():
        for query in ("after=١".encode(), b"after=" + b"9" * 30, b"after=\xff\xfe"):
            assert await refused(query) == 4400, query
        state, sock, _ = await opened(f"/ws/runs/{run.pk}/?after=1", alice)
        assert state == "open"
        await sock.disconnect()

    run_async(scenario)
