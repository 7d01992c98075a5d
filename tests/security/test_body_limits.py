"""No request can fill the web process's memory: a real daphne (config.asgi, PostgreSQL, Redis) gets hostile bodies
on every endpoint that reads one and hostile messages on both websockets; each is answered 400 or 413 (the
sockets close with 4413 or daphne's 1009), never a 5xx, and the process's peak resident memory (VmHWM in
/proc/<pid>/status) grows by at most 30 MB across all of them. A property test then sends random JSON under the
caps. Issue 22: one 50 KB token POST (a 20,000-character key holding 10,000 zeros) once took daphne from 120 MB
to 317 MB, never given back. Limits: config/limits.py, docs/security.md "Size limits"."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from django.contrib.auth import get_user_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runs.models import Run
from tests.processes import committed_database_url
from tests.realtime.conftest import gate, session_cookie, train
from tests.realtime.servers import Daphne, server_env

pytestmark = pytest.mark.django_db(transaction=True)
GROWTH_MAX = 30 * 1024 * 1024
MIB, KIB = 1024 * 1024, 1024
PASSWORD = "a-long-test-password-1"


def vm_hwm(pid: int) -> int:
    """Peak resident memory of a process, in bytes."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", text, re.M).group(1)) * 1024


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker, redis_url) -> Iterator[Daphne]:
    with django_db_blocker.unblock():
        url = committed_database_url("the body-limit tests")
    web = Daphne(server_env(database_url=url, redis_url=redis_url, prefix=f"bl{uuid.uuid4().hex[:6]}"))
    yield web
    web.close()


class Site:
    """The endpoints that read a body, with the credentials each needs, on the real server."""

    def __init__(self, web: Daphne) -> None:
        users = get_user_model().objects
        self.user = users.create_user(username=f"u{uuid.uuid4().hex[:6]}", password=PASSWORD)
        self.staff = users.create_user(username=f"s{uuid.uuid4().hex[:6]}", password=PASSWORD, is_staff=True)
        self.run = Run.objects.create(
            name="r", origin="api", run_class="app", kind="rl_train", owner=self.user, status="running"
        )
        self.http, self.ws, self.pid = web.http, web.ws, web.proc.pid
        self.session = requests.Session()
        self.tokens = {"user": self.token_for(self.user), "staff": self.token_for(self.staff)}

    def token_for(self, user) -> str:
        response = self.session.post(
            f"{self.http}/api/auth/token/", json={"username": user.username, "password": PASSWORD}, timeout=30
        )
        assert response.status_code < 300, (response.status_code, response.text[:300])
        return response.json()["token"]

    def endpoints(self) -> list[tuple[str, str, dict[str, str], int]]:
        """(method, path, headers, body cap) of every endpoint that takes a body (and the samples query)."""
        user = {"Authorization": f"Token {self.tokens['user']}"}
        staff = {"Authorization": f"Token {self.tokens['staff']}"}
        run = self.run.pk
        return [
            ("POST", "/api/auth/token/", {}, 16 * KIB),
            ("POST", "/login/", {}, 16 * KIB),
            ("POST", "/api/runs/", user, MIB),
            ("POST", f"/api/runs/{run}/ingest/", {"Authorization": f"Bearer {self.run.ingest_token}"}, 2 * MIB),
            ("PUT", "/api/settings/concurrency/", staff, MIB),
            ("PATCH", "/api/settings/concurrency/", staff, MIB),
            ("POST", "/api/schedules/", staff, MIB),
            ("GET", f"/api/runs/{run}/samples/", user, MIB),
        ]

    def send(self, method: str, path: str, headers: dict[str, str], body) -> requests.Response:
        headers = {"Content-Type": "application/json", **headers}
        return self.session.request(method, f"{self.http}{path}", data=body, headers=headers, timeout=120)


def hostile_bodies(cap: int) -> Iterator[tuple[str, bytes]]:
    """The shapes of issue 22, at the size of the attack and filled up to the endpoint's cap."""
    key = "k" * 20_000
    yield "long key x many items", json.dumps({key: [0] * 10_000}).encode()
    fit = (cap - 20_010) // 2
    if fit > 0:
        yield "long key x items to the cap", b'{"' + key.encode() + b'": [' + b"0," * fit + b"0]}"
    yield "deep nesting", b"[" * 100_000
    yield "deep nesting within the cap", b'{"a": ' * 2000 + b"1" + b"}" * 2000
    yield "many small keys", json.dumps({f"k{i}": i for i in range(min(cap // 20, 120_000))}).encode()
    yield "many small objects", b"[" + b",".join([b'{"a":0}'] * 24_000) + b"]"
    yield "one huge string", json.dumps({"name": "x" * (cap - 100) + "\U0001f600"}).encode()
    one = json.dumps({"name": "n", "config": {"steps": 1}}).encode()
    yield "concatenated bodies over the cap", one * (cap // len(one) + 2)
    yield "10 MB", b"[" + b"0," * (5 * MIB) + b"0]"


def streamed(body: bytes) -> Iterator[bytes]:
    """A body sent chunked (no Content-Length): the cap must count what comes."""
    for start in range(0, len(body), 64 * KIB):
        yield body[start : start + 64 * KIB]


def assert_refused(response: requests.Response, what: str, cap: int, size: int) -> None:
    assert response.status_code in (400, 413), (what, response.status_code, response.text[:300])
    if response.status_code == 413:
        assert size > cap, (what, size, cap)
        assert response.json() == {"detail": f"body: larger than the limit of {cap} bytes", "limit": cap}
    elif response.headers.get("content-type", "").startswith("application/json"):
        body = response.json()
        assert body["detail"] and body["field"], (what, body)


async def ws_close_code(url: str, cookie: str, message: str | bytes) -> int | None:
    """Send one message on a fresh socket (after its snapshot); the close code that follows, or None when the
    socket is still open a second later."""
    import websockets

    headers = {"Cookie": f"sessionid={cookie}"}
    async with websockets.connect(url, additional_headers=headers, origin="http://127.0.0.1", max_size=None) as ws:
        await asyncio.wait_for(ws.recv(), 30)  # the snapshot
        try:
            await ws.send(message)
            while True:
                await asyncio.wait_for(ws.recv(), 1)
        except TimeoutError:
            return None
        except websockets.ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else 1006


def test_hostile_bodies_and_messages_are_refused_within_30_mb(server) -> None:
    site = Site(server)
    endpoints = site.endpoints()
    for method, path, headers, _cap in endpoints:  # warm up: every view imported and answered once
        site.send(method, path, headers, b"{}")
    before = vm_hwm(site.pid)
    for method, path, headers, cap in endpoints:
        for what, body in hostile_bodies(cap):
            if (path == "/login/" or method == "GET") and len(body) <= cap:
                continue  # a form page and a GET do not parse a JSON body: only the cap applies to them
            assert_refused(site.send(method, path, headers, body), f"{method} {path}: {what}", cap, len(body))
            if len(body) > cap:
                response = site.send(method, path, headers, streamed(body))
                assert_refused(response, f"{method} {path}: {what}, chunked", cap, len(body))
    samples = f"/api/runs/{site.run.pk}/samples/"
    auth = {"Authorization": f"Token {site.tokens['user']}"}
    for query in ("?" + "&".join(f"x{i}=1" for i in range(1000)), "?step=" + "9" * 8000, "?ordering=" + "k" * 8000):
        response = site.session.get(f"{site.http}{samples}{query}", headers=auth, timeout=60)
        assert response.status_code == 400, (query[:40], response.status_code, response.text[:300])

    cookie = session_cookie(site.user)
    for path in ("/ws/dashboard/", f"/ws/runs/{site.run.pk}/"):
        url = f"{site.ws}{path}"
        assert asyncio.run(ws_close_code(url, cookie, "[" * 4000)) is None  # within 4 KiB: ignored, still open
        assert asyncio.run(ws_close_code(url, cookie, "[" * 100_000)) == 4413
        assert asyncio.run(ws_close_code(url, cookie, b"\0" * 8192)) == 4413
        # daphne's own 1 MiB cap: it fails the connection with 1009, often before the client, still sending, can
        # read that close frame (then 1006); never 1011, an error of the application.
        assert asyncio.run(ws_close_code(url, cookie, "x" * (2 * MIB))) in (1009, 1006)

    # What the caps are for is still let in: a batch of 1,000 ordinary events (gate and train).
    batch = [gate(seq) if seq % 2 else train(seq, seq) for seq in range(1, 1001)]
    ingest = endpoints[3]
    response = site.send("POST", ingest[1], ingest[2], json.dumps(batch).encode())
    assert response.status_code == 200 and response.json()["stored"] == 1000, response.text[:300]

    growth = vm_hwm(site.pid) - before
    print(f"daphne VmHWM growth across every hostile body and message: {growth / MIB:.1f} MiB")
    assert growth <= GROWTH_MAX, f"{growth / MIB:.1f} MiB"


def json_documents() -> st.SearchStrategy:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=300)
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=40) | st.dictionaries(st.text(max_size=300), inner, max_size=40),
        max_leaves=400,
    )


def test_random_json_under_the_caps_is_never_a_5xx(server) -> None:
    site = Site(server)
    endpoints = [e for e in site.endpoints() if e[0] != "GET"]
    for method, path, headers, _cap in endpoints:
        site.send(method, path, headers, b"{}")
    before = vm_hwm(site.pid)

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(body=json_documents(), pick=st.integers(0, len(endpoints) - 1), wrap=st.booleans())
    def one(body, pick: int, wrap: bool) -> None:
        method, path, headers, cap = endpoints[pick]
        if wrap:  # the outer shapes the views expect, with random insides
            body = [{"seq": 1, "type": "log", "data": body}] if "ingest" in path else {"name": "n", "config": body}
        raw = json.dumps(body).encode()
        response = site.send(method, path, headers, raw)
        assert response.status_code < 500, (method, path, raw[:300], response.status_code, response.text[:300])
        assert response.status_code != 413 or len(raw) > cap

    one()
    growth = vm_hwm(site.pid) - before
    print(f"daphne VmHWM growth across random bodies: {growth / MIB:.1f} MiB")
    assert growth <= GROWTH_MAX, f"{growth / MIB:.1f} MiB"
