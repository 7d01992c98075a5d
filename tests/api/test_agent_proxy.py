"""The proxy to a run's session server (`/api/runs/<id>/v1/...`, runs/api/proxy.py) on a real daphne with
PostgreSQL and Redis, against a real HTTP upstream (tests/api/session_double.py). The run's serving URL arrives
the way a job reports it: a `serving` event posted to the real ingest endpoint. The official `openai` client is
pointed at the platform unchanged (base_url, api_key = an API token)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
import requests
from django.contrib.auth import get_user_model
from django.middleware.csrf import _get_new_csrf_string

from runs.auth.tokens import token_issue
from runs.core import lifecycle
from runs.models import ClusterNode, Run, RunStatus
from tests.api.session_double import SLOW_CHUNKS, SessionServerDouble
from tests.processes import committed_database_url
from tests.realtime.conftest import session_cookie
from tests.realtime.servers import Daphne, server_env
from tests.security.api_fixtures import fresh_cache  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)
CHAT = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def web(django_db_setup, django_db_blocker, redis_url) -> Iterator[Daphne]:
    with django_db_blocker.unblock():
        url = committed_database_url("the agent proxy tests")
    server = Daphne(server_env(database_url=url, redis_url=redis_url, prefix=f"ap{uuid.uuid4().hex[:6]}"))
    yield server
    server.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[SessionServerDouble]:
    server = SessionServerDouble().start()
    yield server
    server.close()


class Site:
    def __init__(self, web: Daphne, upstream: SessionServerDouble) -> None:
        users = get_user_model().objects
        tag = uuid.uuid4().hex[:6]
        self.owner = users.create_user(username=f"owner{tag}", password="pw")
        self.other = users.create_user(username=f"other{tag}", password="pw")
        self.staff = users.create_user(username=f"staff{tag}", password="pw", is_staff=True)
        self.run = Run.objects.create(
            name="r", origin="api", run_class="app", kind="rl_train", owner=self.owner, status=RunStatus.RUNNING
        )
        self.web, self.upstream = web, upstream
        upstream.keys.add(self.run.serving_keys()[0])
        self.base = f"{web.http}/api/runs/{self.run.pk}/v1"

    def report_serving(self, url: str, seq: int = 1) -> requests.Response:
        event = {"seq": seq, "type": "serving", "data": {"url": url, "model": "r@v3"}}
        return requests.post(
            f"{self.web.http}/api/runs/{self.run.pk}/ingest/",
            json=[event],
            headers={"Authorization": f"Bearer {self.run.ingest_token}"},
            timeout=30,
        )

    def client(self, user) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base, api_key=token_issue(user), max_retries=0, timeout=30)

    def seen_last(self) -> dict:
        return self.upstream.seen[-1]


@pytest.fixture
def site(web, upstream) -> Site:
    s = Site(web, upstream)
    assert s.report_serving(upstream.url).status_code == 200
    s.run.refresh_from_db()
    assert s.run.serving_url == upstream.url
    return s


def test_owner_chats_plain_and_streaming_through_the_openai_client(site: Site) -> None:
    client = site.client(site.owner)
    answer = client.chat.completions.create(model="r", messages=CHAT, extra_body={"session_id": "s1"})
    assert answer.choices[0].message.content == "echo: hello"
    seen = site.seen_last()
    assert seen["path"] == "/v1/chat/completions"
    # Namespaced for the session server; the caller's token never crosses, the run's serving key does.
    assert seen["body"]["session_id"] == f"ext-{site.owner.pk}-s1"
    assert seen["headers"]["X-Session-Id"] == f"ext-{site.owner.pk}-s1"
    assert seen["headers"]["Authorization"] == f"Bearer {site.run.serving_keys()[0]}"

    pieces = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model="r", messages=CHAT, stream=True, extra_headers={"X-Session-Id": "s2"}
        )
    ]
    assert "".join(pieces) == "echo: hello" and len(pieces) >= 3
    assert site.seen_last()["body"]["session_id"] == f"ext-{site.owner.pk}-s2"

    completion = client.completions.create(model="r", prompt="1+1=")
    assert completion.choices[0].text == "echo: 1+1="
    assert [m.id for m in client.models.list()] == ["run@v3"]


def test_a_session_id_is_always_namespaced_and_a_fresh_one_is_returned(site: Site) -> None:
    token = token_issue(site.owner)
    answer = httpx.post(
        f"{site.base}/chat/completions", json={"messages": CHAT}, headers={"Authorization": f"Token {token}"}
    )
    assert answer.status_code == 200, answer.text
    fresh = answer.headers["X-Session-Id"]
    assert site.seen_last()["body"]["session_id"] == f"ext-{site.owner.pk}-{fresh}"
    # A caller cannot escape its namespace by naming a training session, another user's, or a path.
    answer = httpx.post(
        f"{site.base}/chat/completions",
        json={"messages": CHAT, "session_id": f"ext-{site.other.pk}-s1"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert site.seen_last()["body"]["session_id"] == f"ext-{site.owner.pk}-ext-{site.other.pk}-s1"
    trajectory = httpx.get(f"{site.base}/sessions/s1/trajectory", headers={"Authorization": f"Bearer {token}"})
    assert trajectory.status_code == 200
    assert site.seen_last()["path"] == f"/v1/sessions/ext-{site.owner.pk}-s1/trajectory"
    assert trajectory.json()["segments"][0]["versions"] == [3, 3]
    bad = httpx.get(f"{site.base}/sessions/..%2Fx/trajectory", headers={"Authorization": f"Bearer {token}"})
    assert bad.status_code in (400, 404)
    for path in ("engines", "sessions/s1", "chat/completions/x", "admin"):
        assert httpx.get(f"{site.base}/{path}", headers={"Authorization": f"Bearer {token}"}).status_code == 404
    assert httpx.get(f"{site.base}/chat/completions", headers={"Authorization": f"Bearer {token}"}).status_code == 405


def test_another_user_gets_404_and_staff_gets_through(site: Site) -> None:
    before = len(site.upstream.seen)
    with pytest.raises(openai.NotFoundError):
        site.client(site.other).chat.completions.create(model="r", messages=CHAT)
    assert len(site.upstream.seen) == before  # nothing reached the session server
    anonymous = httpx.post(f"{site.base}/chat/completions", json={"messages": CHAT})
    assert anonymous.status_code == 401
    bad_token = httpx.post(
        f"{site.base}/chat/completions", json={"messages": CHAT}, headers={"Authorization": "Bearer nope"}
    )
    assert bad_token.status_code == 401
    answer = site.client(site.staff).chat.completions.create(model="r", messages=CHAT)
    assert answer.choices[0].message.content == "echo: hello"
    assert site.seen_last()["body"]["session_id"].startswith(f"ext-{site.staff.pk}-")


def test_browser_session_needs_its_csrf_token(site: Site) -> None:
    cookies = {"sessionid": session_cookie(site.owner)}
    refused = httpx.post(f"{site.base}/chat/completions", json={"messages": CHAT}, cookies=cookies)
    assert refused.status_code == 403
    csrf = _get_new_csrf_string()
    answer = httpx.post(
        f"{site.base}/chat/completions",
        json={"messages": CHAT},
        cookies={**cookies, "csrftoken": csrf},
        headers={"X-CSRFToken": csrf},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "echo: hello"
    assert httpx.get(f"{site.base}/models", cookies=cookies).status_code == 200  # GET: no CSRF token needed


def test_oversized_and_hostile_bodies_are_refused_before_forwarding(site: Site) -> None:
    headers = {"Authorization": f"Bearer {token_issue(site.owner)}"}
    before = len(site.upstream.seen)
    big = {"messages": [{"role": "user", "content": "x" * 60_000}] * 5}
    assert httpx.post(f"{site.base}/chat/completions", json=big, headers=headers).status_code == 413
    deep: object = "x"
    for _ in range(200):
        deep = [deep]
    hostile = {
        "messages": deep,
        "deep": "[" * 100_000,
    }
    cases = [
        ({"messages": deep}, "body"),
        (hostile, "body"),
        ({"messages": CHAT, "n": 10**9}, "n"),
        ({"messages": CHAT, "max_tokens": 10**12}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}] * 5000}, "messages"),
        ({"messages": [{"role": "user", "content": 123}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
        ({"messages": CHAT, "stream": "yes"}, "stream"),
        ({"messages": CHAT, "session_id": "../../x"}, "session_id"),
        ([1, 2], "body"),
    ]
    for body, field in cases:
        answer = httpx.post(f"{site.base}/chat/completions", json=body, headers=headers)
        assert answer.status_code == 400, (field, answer.status_code, answer.text[:200])
        assert answer.json()["field"] == field and answer.json()["error"]["param"] == field
    raw = httpx.post(
        f"{site.base}/chat/completions",
        content=b'{"messages": [NaN]}',
        headers={**headers, "Content-Type": "application/json"},
    )
    assert raw.status_code == 400
    assert len(site.upstream.seen) == before


def test_client_disconnect_mid_stream_closes_the_upstream_stream(site: Site) -> None:
    site.upstream.slow_closed.clear()
    token = token_issue(site.owner)
    body = {"messages": [{"role": "user", "content": "slow"}], "stream": True}
    with httpx.stream(
        "POST", f"{site.base}/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        first = next(answer.iter_raw())
        assert first.startswith(b"data: ")
    # The client is gone: the proxy must close its upstream stream, long before the stream would have ended.
    assert site.upstream.slow_closed.wait(10), "the upstream stream outlived its client"
    assert site.upstream.slow_sent < SLOW_CHUNKS


def test_serving_urls_are_vetted_and_cleared_when_the_run_ends(site: Site) -> None:
    # Not a node of the cluster: stored without its URL, and the run keeps the one it had.
    assert site.report_serving("http://10.255.255.1:8000", seq=2).status_code == 200
    site.run.refresh_from_db()
    assert site.run.serving_url == site.upstream.url
    # Malformed (a name, a path, https): refused by the event schema, the batch with it.
    for seq, url in enumerate(("http://metadata.internal:80", "http://127.0.0.1:8000/admin", "https://127.0.0.1:9"), 3):
        assert site.report_serving(url, seq=seq).status_code == 400
    # A node the tick read from Ray is a valid host.
    ClusterNode.objects.create(node_id="n2", address="192.0.2.7", alive=True, total={}, seen_at=site.run.created_at)
    assert site.report_serving("http://192.0.2.7:9000", seq=10).status_code == 200
    site.run.refresh_from_db()
    assert site.run.serving_url == "http://192.0.2.7:9000"
    lifecycle.run_finish(run=site.run, status=RunStatus.FAILED, error="test")
    site.run.refresh_from_db()
    assert site.run.serving_url == ""
    answer = httpx.get(f"{site.base}/models", headers={"Authorization": f"Bearer {token_issue(site.owner)}"})
    assert answer.status_code == 404


def test_the_jobs_final_report_stops_the_forwarding_before_the_run_is_finished(site: Site) -> None:
    """A cancelled run stays `stopping` until its job has ended (runs/execution/outcome.py), but the job stops its
    session server right after posting its final report: from that report on the proxy answers 404, not 502."""
    owner = {"Authorization": f"Bearer {token_issue(site.owner)}"}
    Run.objects.filter(pk=site.run.pk).update(status=RunStatus.STOPPING)
    assert httpx.get(f"{site.base}/models", headers=owner).status_code == 200  # a stopping job still serves
    events = [
        {"seq": 2, "type": "status", "data": {"status": "stopping", "version": 3}},
        {"seq": 3, "type": "status", "data": {"status": "cancelled", "version": 3}},
    ]
    for event in events:
        posted = requests.post(
            f"{site.web.http}/api/runs/{site.run.pk}/ingest/",
            json=[event],
            headers={"Authorization": f"Bearer {site.run.ingest_token}"},
            timeout=30,
        )
        assert posted.status_code == 200, posted.text
        site.run.refresh_from_db()
        assert site.run.serving_url == ("" if event["data"]["status"] == "cancelled" else site.upstream.url)
    assert site.run.status == RunStatus.STOPPING  # finished by the reconcile, once Ray says the job ended
    answer = httpx.get(f"{site.base}/models", headers=owner)
    assert answer.status_code == 404 and "is stopping: it is not serving" in answer.json()["detail"], answer.text


def test_a_running_run_without_a_server_yet_answers_503(web, upstream) -> None:
    s = Site(web, upstream)
    started = time.monotonic()
    answer = httpx.get(f"{s.base}/models", headers={"Authorization": f"Bearer {token_issue(s.owner)}"})
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "5"
    assert time.monotonic() - started < 5


def test_past_the_per_user_rate_the_proxy_answers_429_with_retry_after(settings, fresh_cache) -> None:
    """In process (the rate is a setting of this process): the throttle comes before the serving check."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    settings.HEAVY_READ_THROTTLE_RATES = {"agents": "3/min"}
    users = get_user_model().objects
    owner, other = users.create_user(username="t-owner"), users.create_user(username="t-other")
    run = Run.objects.create(name="r", origin="api", run_class="app", kind="rl_train", owner=owner, status="running")
    path = f"/api/runs/{run.pk}/v1/models"

    async def ask(user) -> list:
        auth = {"Authorization": f"Bearer {token_for[user.pk]}"}
        return [(await AsyncClient().get(path, headers=auth)) for _ in range(4)]

    token_for = {owner.pk: token_issue(owner), other.pk: token_issue(other)}
    answers = async_to_sync(ask)(owner)
    assert [a.status_code for a in answers] == [503, 503, 503, 429]
    assert int(answers[-1]["Retry-After"]) >= 1
    other_run = Run.objects.create(
        name="o", origin="api", run_class="app", kind="rl_train", owner=other, status="running"
    )
    path = f"/api/runs/{other_run.pk}/v1/models"
    assert [a.status_code for a in async_to_sync(ask)(other)][:3] == [503, 503, 503]  # counted per user
