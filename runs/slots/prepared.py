"""Server-side prepared statements for the slot fast path on PostgreSQL (the release, the snapshot, the grant).

Planning these statements cost more server CPU than running them (about 0.3-0.5 ms each, against 0.2-0.3 ms
to run), and a release -> grant cycle runs four of them. So each is prepared once per database session with a
generic plan (`plan_cache_mode = force_generic_plan`, a session setting: Django's own queries bind on the
client and are never prepared, so only these statements are affected) and then run as `EXECUTE name(...)`.

PREPARE is not transactional, so a statement is prepared (in its own round trip, once per session) whenever
the session is idle or in a healthy transaction; the setting is made when it is idle (a SET inside a transaction
that rolls back would be undone: the statements would then only be planned per run, never wrong). In an aborted
transaction, and on any other database, `sql()` is the plain statement. Sessions are tracked by the driver
connection object: a new connection (Django closes them per request) prepares again on first use. Nothing here
may run DISCARD or DEALLOCATE (a pool's `reset` that did would have to forget the session too).
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
import weakref
from typing import Any

from django.db import connection

_PARAM = re.compile(r"%\((\w+)\)s")
_GENERIC = "SET plan_cache_mode = force_generic_plan"


class _Session:
    def __init__(self) -> None:
        self.prepared: set[str] = set()
        self.generic = False


_sessions: weakref.WeakKeyDictionary[Any, _Session] = weakref.WeakKeyDictionary()
_sessions_lock = threading.Lock()


class Statement:
    """One SQL statement with %(name)s parameters, run prepared where the session allows it."""

    def __init__(self, sql: str) -> None:
        self.plain = sql
        self.names = tuple(dict.fromkeys(_PARAM.findall(sql)))
        numbered = _PARAM.sub(lambda m: f"${self.names.index(m.group(1)) + 1}", sql)
        self.name = "rlcp_" + hashlib.sha1(sql.encode()).hexdigest()[:16]
        self.prepare = f"PREPARE {self.name} AS {numbered}"
        self.execute = f"EXECUTE {self.name}(" + ", ".join(f"%({n})s" for n in self.names) + ")"

    def sql(self) -> str:
        """What to send now: `EXECUTE` once prepared in this session (preparing it first if need be), else the
        plain statement."""
        if connection.vendor != "postgresql":
            return self.plain
        from psycopg.pq import TransactionStatus

        connection.ensure_connection()
        conn = connection.connection
        with _sessions_lock:
            session = _sessions.setdefault(conn, _Session())
        status = conn.info.transaction_status
        todo = [_GENERIC] if not session.generic and status == TransactionStatus.IDLE else []
        if self.name not in session.prepared:
            if status not in (TransactionStatus.IDLE, TransactionStatus.INTRANS):
                return self.plain
            todo.append(self.prepare)
        if todo:
            with connection.cursor() as cursor:
                cursor.execute(";\n".join(todo))
            session.generic = session.generic or todo[0] == _GENERIC
            session.prepared.add(self.name)
        return self.execute


@functools.lru_cache(maxsize=64)
def statement(sql: str) -> Statement:
    """The Statement of this SQL text (one per distinct text: a release's SET list depends on the move)."""
    return Statement(sql)


__all__ = ["Statement", "statement"]
