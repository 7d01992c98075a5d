"""rlcp_websocket_connections counts the open sockets of every web process from the presence sets in Redis
(frontend/ws_guard.py): it follows real connections through config.asgi.application, and /metrics shows it."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from frontend.ws_guard import presence_count
from tests.realtime.conftest import communicator, run_async, user_make

pytestmark = pytest.mark.django_db(transaction=True)
WAIT = 30


def scraped(staff) -> float:
    client = Client()
    client.force_login(staff)
    text = client.get("/metrics").content.decode()
    return next(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "rlcp_websocket_connections"
    )


def test_websocket_gauge_follows_connections():
    alice, staff = user_make("alice"), user_make("metrics-staff", staff=True)

    async def scenario() -> list[int]:
        seen = [await sync_to_async(presence_count)()]
        socks = [communicator("/ws/dashboard/", alice) for _ in range(3)]
        for comm in socks:
            assert (await comm.connect(timeout=WAIT))[0]
            await comm.receive_json_from(timeout=WAIT)  # the snapshot: the guard has counted it
        seen.append(await sync_to_async(presence_count)())
        seen.append(int(await sync_to_async(scraped)(staff)))  # what Prometheus reads
        await socks[0].disconnect(timeout=WAIT)
        seen.append(await sync_to_async(presence_count)())
        for comm in socks[1:]:
            await comm.disconnect(timeout=WAIT)
        seen.append(await sync_to_async(presence_count)())
        return seen

    assert run_async(scenario) == [0, 3, 3, 2, 0]
    assert scraped(staff) == 0
