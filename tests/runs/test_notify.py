"""PostgreSQL NOTIFY of slot changes: a listener on another connection hears each committed grant pass."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection

from runs import services
from runs.notify import CHANNEL, slots_listen
from tests.runs.helpers import TEST_KIND
from tests.wait import wait_until


@pytest.mark.django_db(transaction=True)
def test_listener_wakes_on_commit_with_granted_ids(user, handoffs):
    assert connection.vendor == "postgresql", "NOTIFY needs PostgreSQL (make test uses it)"
    params = connection.get_connection_params()
    app = f"notify-test-{uuid.uuid4().hex[:8]}"  # names the listener's connection in pg_stat_activity
    dsn = (
        f"host={params['host']} port={params.get('port') or 5432} dbname={params['dbname']} user={params['user']}"
        f" application_name={app}"
    )
    heard: list[dict] = []

    def listen() -> None:
        for payload in slots_listen(timeout=10, dsn=dsn):
            heard.append(payload)
            if payload.get("granted"):
                return

    def listening() -> bool:  # the listener's LISTEN has completed (its backend is idle after it)
        with connection.cursor() as cursor:
            cursor.execute("SELECT state, query FROM pg_stat_activity WHERE application_name = %s", [app])
            return cursor.fetchall() == [("idle", f"LISTEN {CHANNEL}")]

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    wait_until(listening, timeout=15, what="the listener's LISTEN", interval=0.02)
    run = services.run_submit(owner=user, name="n", origin="api", kind=TEST_KIND, config={})
    thread.join(15)
    assert heard and heard[-1]["reason"] == "submit" and heard[-1]["granted"] == [run.pk]
    assert isinstance(heard[-1]["t"], float)
