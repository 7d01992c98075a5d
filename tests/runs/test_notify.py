"""PostgreSQL NOTIFY of slot changes: a listener on another connection hears each committed grant pass."""
from __future__ import annotations

import threading

import pytest
from django.db import connection

from runs import services
from runs.notify import slots_listen
from tests.runs.helpers import TEST_KIND


@pytest.mark.django_db(transaction=True)
def test_listener_wakes_on_commit_with_granted_ids(user, handoffs):
    assert connection.vendor == "postgresql", "NOTIFY needs PostgreSQL (make test uses it)"
    params = connection.get_connection_params()
    dsn = f"host={params['host']} port={params.get('port') or 5432} dbname={params['dbname']} user={params['user']}"
    heard: list[dict] = []
    listening = threading.Event()

    def listen() -> None:
        listening.set()
        for payload in slots_listen(timeout=10, dsn=dsn):
            heard.append(payload)
            if payload.get("granted"):
                return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    listening.wait(5)
    import time

    time.sleep(0.5)  # LISTEN is issued right after the thread starts
    run = services.run_submit(owner=user, name="n", origin="api", kind=TEST_KIND, config={})
    thread.join(15)
    assert heard and heard[-1]["reason"] == "submit" and heard[-1]["granted"] == [run.pk]
    assert isinstance(heard[-1]["t"], float)
