"""PostgreSQL LISTEN/NOTIFY of slot changes, so waiting parties and dashboards wake at once.

`slots_notify` queues a notification inside the current transaction (PostgreSQL delivers it on commit, never on
rollback); `slots_listen` yields payloads to a listener. On SQLite both are no-ops / unavailable: the tick is the
fallback there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from django.db import connection

CHANNEL = "slots_changed"


def is_postgresql() -> bool:
    return connection.vendor == "postgresql"


def slots_notify(payload: dict[str, Any]) -> None:
    """Queue a `slots_changed` notification with a small JSON payload (granted run ids, reason, timestamps)."""
    if not is_postgresql():
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, json.dumps(payload, separators=(",", ":"))])


def slots_listen(*, timeout: float | None = None, dsn: str | None = None) -> Iterator[dict[str, Any]]:
    """Yield decoded notification payloads from a dedicated autocommit connection until `timeout` passes
    without a notification (None: forever). Uses its own connection so it never holds Django's."""
    import psycopg

    if dsn is None:
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        with psycopg.connect(**params, autocommit=True) as conn:
            yield from _listen(conn, timeout)
    else:
        with psycopg.connect(dsn, autocommit=True) as conn:
            yield from _listen(conn, timeout)


def _listen(conn: Any, timeout: float | None) -> Iterator[dict[str, Any]]:
    conn.execute(f"LISTEN {CHANNEL}")
    while True:
        got = False
        for note in conn.notifies(timeout=timeout, stop_after=1):
            got = True
            try:
                yield json.loads(note.payload)
            except ValueError:
                yield {"raw": note.payload}
        if not got:
            return
