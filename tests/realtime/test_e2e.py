"""End to end over real processes: daphne + PostgreSQL + a private Redis, the `websockets` client, HTTP ingest.

Restarting Redis mid-stream must leave every client with exactly 1..N; two ASGI processes and two Celery
workers on one database and Redis: a client on either process gets every event, and slot limits hold.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
import requests

from runs.models import Run, RunEvent, Slot, SlotState
from runs.scheduling.concurrency import settings_update
from tests.processes import committed_database_url
from tests.realtime.conftest import run_async, run_make, train, user_make
from tests.realtime.servers import CeleryWorker, Daphne, RedisServer, StreamClient, free_port, server_env
from tests.wait import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def redis_server():
    server = RedisServer().start()
    yield server
    server.close()


def env_for(redis: RedisServer, **extra: str) -> dict[str, str]:
    url = committed_database_url("the end-to-end real-time tests")
    return server_env(database_url=url, redis_url=redis.url, prefix=f"e2e{uuid.uuid4().hex[:6]}", **extra)


def post_events(base: str, run: Run, first: int, last: int, *, rate: float, on_seq=None) -> None:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {run.ingest_token}"
    for seq in range(first, last + 1):
        started = time.monotonic()
        response = session.post(f"{base}/api/runs/{run.pk}/ingest/", json=[train(seq, seq)], timeout=60)
        assert response.status_code == 200, response.text
        if on_seq is not None:
            on_seq(seq, started)
        time.sleep(1 / rate)


def test_redis_restart_during_a_stream_leaves_clients_exact(redis_server):
    owner = user_make("owner")
    run = run_make(owner)
    # No idle resync here: after the restart only live messages (and the gap fills they trigger) can complete the
    # stream, so finishing proves the layer resubscribed and the clients' gaps were filled from the database.
    # The idle resync has its own test.
    web = Daphne(env_for(redis_server, REALTIME_RESYNC_SECONDS="600"))
    total, kill_after, during_wanted = 120, 40, 5
    posted: dict[int, tuple[float, float]] = {}  # seq -> (request sent, answered 200), monotonic
    outage: dict[str, float] = {}
    restarter_errors: list[BaseException] = []

    def on_posted(seq: int, started: float) -> None:
        posted[seq] = (started, time.monotonic())

    def made_while_down() -> list[int]:
        return [seq for seq, (sent, _) in list(posted.items()) if sent >= outage["down"]]

    def restart_while_posting() -> None:
        # Its own thread: the posting thread goes on at its pace while Redis is down and while it comes back.
        try:
            wait_until(lambda: kill_after in posted, timeout=120, what=f"post {kill_after}")
            outage["down"] = time.monotonic()
            redis_server.kill()
            try:
                # Down until several posts were sent and answered inside the outage (at least 1 s).
                wait_until(
                    lambda: len(made_while_down()) >= during_wanted,
                    timeout=60,
                    what=f"{during_wanted} posts answered while Redis is down",
                )
                wait_until(lambda: time.monotonic() - outage["down"] >= 1.0, timeout=5, what="1 s of outage")
            finally:
                outage["during"] = made_while_down()
                redis_server.start()
                outage["up"] = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - reported by the test's assertion
            restarter_errors.append(exc)

    try:
        clients = [StreamClient(web.ws, run.pk, owner.cookie) for _ in range(3)]

        async def scenario():
            tasks = [asyncio.create_task(c.run_until(total, timeout=120)) for c in clients]
            await asyncio.gather(*(c.connected.wait() for c in clients))
            restarter = threading.Thread(target=restart_while_posting)
            restarter.start()
            await asyncio.to_thread(post_events, web.http, run, 1, total, rate=50, on_seq=on_posted)
            await asyncio.to_thread(restarter.join)
            await asyncio.gather(*tasks)

        run_async(scenario)
    finally:
        web.close()
    assert not restarter_errors, restarter_errors
    during = outage["during"]
    assert len(during) >= during_wanted and min(during) > kill_after, during  # posted while Redis was down
    stored = set(RunEvent.objects.filter(run_id=run.pk, source_seq__in=during).values_list("source_seq", flat=True))
    assert stored == set(during)  # each post made during the outage was stored
    assert [s for s, (sent, _) in posted.items() if sent > outage["up"]], "no post after Redis came back"
    for client in clients:  # the gap the outage left in the live stream was filled: every seq once, in order
        assert client.seqs == list(range(1, total + 1)), (client.errors, client.seqs)
    assert Run.objects.get(pk=run.pk).last_seq == total
    print(f"Redis down {outage['up'] - outage['down']:.1f} s; posts {min(during)}..{max(during)} made meanwhile")


def test_two_asgi_processes_and_two_celery_workers_share_events_and_slot_limits(redis_server):
    staff = user_make("staff", staff=True)
    settings_update(changes={"max_total": 3}, partial=True, by=staff)  # reserve: 1 interactive
    # Ray is unreachable here, so granted runs stay `starting` and hold their slots (launches are retried).
    # No idle resync: only live messages (and the gap fills they trigger) can reach the clients, so their
    # completeness shows the cross-process fan-out works.
    env = env_for(redis_server, RAY_ADDRESS=f"http://127.0.0.1:{free_port()}", REALTIME_RESYNC_SECONDS="600")
    webs = [Daphne(env), Daphne(env)]
    workers = [CeleryWorker(env, "w1"), CeleryWorker(env, "w2")]
    try:
        for worker in workers:
            worker.wait_ready()
        api = [requests.Session() for _ in webs]
        for session, web in zip(api, webs):
            token = session.post(f"{web.http}/api/auth/token/", json={"username": "staff", "password": "pw"}).json()
            session.headers["Authorization"] = f"Token {token['token']}"

        def submit(i: int) -> None:
            web, session = webs[i % 2], api[i % 2]
            body = {"name": f"r{i}", "origin": ("api", "dashboard")[i % 2]}
            response = session.post(f"{web.http}/api/runs/", json=body, timeout=60)
            assert response.status_code == 201, response.text

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        held = Slot.objects.filter(state=SlotState.HELD)
        assert held.count() == 3 and Slot.objects.filter(state=SlotState.WAITING).count() == 3
        assert held.exclude(run_class="interactive").count() <= 2  # the interactive reserve holds

        run = Run.objects.filter(status="starting").order_by("id").first()
        start_seq = run.last_seq  # its status events (queued, starting) are already in the stream
        total = start_seq + 60
        clients = [StreamClient(web.ws, run.pk, staff.cookie) for web in webs for _ in range(2)]

        def post_alternating():
            for seq in range(1, 61):  # the job's batches land on either process, as behind a proxy
                post_events(webs[seq % 2].http, run, seq, seq, rate=100)

        async def scenario():
            tasks = [asyncio.create_task(c.run_until(total, timeout=120)) for c in clients]
            await asyncio.gather(*(c.connected.wait() for c in clients))
            await asyncio.to_thread(post_alternating)
            await asyncio.gather(*tasks)

        run_async(scenario)
        for client in clients:
            assert client.seqs == list(range(1, total + 1))
            assert client.drops == 0, client.errors
        assert Slot.objects.filter(state=SlotState.HELD).count() == 3
        assert all(w.proc.poll() is None for w in workers)
        assert any("runs.tasks.dispatch_run" in w.log.read_text() for w in workers)
    finally:
        for proc in [*webs, *workers]:
            proc.close()
