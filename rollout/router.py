"""SessionAffinityRouter: sticky session-to-engine bindings, with bounded, expiring tombstones for dead engines."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from rollout.errors import NoEngineError, RouterFullError, SessionGoneError


class SessionAffinityRouter:
    """Binds each agent session to one engine for its whole life, across weight publications.

    New sessions go to the engine with the fewest requests in flight: this router's own requests (counted
    by `request_started`/`request_finished`) plus the other callers' requests as the engine last reported
    them (`request_finished(engine, reported=...)`, e.g. from the load an engine returns with each answer);
    ties go to the engine with fewer bound sessions, then the lowest id. Bound sessions never move.

    A session whose engine died becomes a tombstone: asking for it again raises SessionGoneError, because
    its KV cache and partial turn are gone and replaying a non-idempotent request is never safe. Tombstones
    expire after `tombstone_ttl_s` and at most `max_tombstones` are kept (oldest evicted first).
    """

    def __init__(
        self,
        engines: Iterable[str] = (),
        *,
        max_sessions: int = 100_000,
        tombstone_ttl_s: float = 3600.0,
        max_tombstones: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_sessions < 1 or max_tombstones < 1 or tombstone_ttl_s <= 0:
            raise ValueError("max_sessions and max_tombstones must be >= 1 and tombstone_ttl_s > 0")
        self._max_sessions = max_sessions
        self._ttl = tombstone_ttl_s
        self._max_tombstones = max_tombstones
        self._clock = clock
        self._lock = threading.Lock()
        self._load: dict[str, int] = {}  # live engine -> bound sessions
        self._bound: dict[str, str] = {}  # session -> engine
        self._own: dict[str, int] = {}  # live engine -> this router's requests in flight there
        self._others: dict[str, int] = {}  # live engine -> other callers' requests there, as last reported
        # session -> (expires_at, engine, reason); insertion order == expiry order (constant TTL).
        self._tombstones: OrderedDict[str, tuple[float, str, str]] = OrderedDict()
        for engine in engines:
            self.add_engine(engine)

    def add_engine(self, engine_id: str) -> None:
        with self._lock:
            if engine_id in self._load:
                raise ValueError(f"engine {engine_id!r} is already registered")
            self._load[engine_id] = 0
            self._own[engine_id] = self._others[engine_id] = 0

    def remove_engine(self, engine_id: str, *, reason: str = "died") -> list[str]:
        """Drop an engine; its sessions become tombstones. Returns those session ids."""
        with self._lock:
            self._load.pop(engine_id, None)
            self._own.pop(engine_id, None)
            self._others.pop(engine_id, None)
            gone = [s for s, e in self._bound.items() if e == engine_id]
            expires = self._clock() + self._ttl
            for session in gone:
                del self._bound[session]
                self._tombstones.pop(session, None)
                self._tombstones[session] = (expires, engine_id, reason)
            self._expire_locked()
            return gone

    def acquire(self, session_id: str) -> str:
        """The engine serving `session_id`; a new session goes to the least-loaded live engine."""
        with self._lock:
            engine = self._bound.get(session_id)
            if engine is not None:
                return engine
            self._expire_locked()
            tomb = self._tombstones.get(session_id)
            if tomb is not None:
                raise SessionGoneError(session_id, tomb[1], tomb[2])
            if not self._load:
                raise NoEngineError(f"no live engine to bind session {session_id!r}")
            if len(self._bound) >= self._max_sessions:
                raise RouterFullError(
                    f"router holds its maximum of {self._max_sessions} sessions; release or retire sessions first"
                )
            engine = min(self._load, key=lambda e: (self._own[e] + self._others[e], self._load[e], e))
            self._load[engine] += 1
            self._bound[session_id] = engine
            return engine

    def request_started(self, engine_id: str) -> None:
        """This router's caller sent a request to `engine_id` (balance counts it until request_finished)."""
        with self._lock:
            if engine_id in self._own:
                self._own[engine_id] += 1

    def request_finished(self, engine_id: str, *, reported: int | None = None) -> None:
        """A request to `engine_id` ended; `reported`: the engine's own in-flight count as it answered (all
        callers, this request excluded), from which the other callers' share is kept."""
        with self._lock:
            if engine_id not in self._own:
                return
            self._own[engine_id] = max(0, self._own[engine_id] - 1)
            if reported is not None:
                self._others[engine_id] = max(0, reported - self._own[engine_id])

    def remove_session(self, session_id: str, engine_id: str, reason: str) -> None:
        """The engine lost this one session (e.g. evicted its cache): tombstone it like a dead engine's."""
        with self._lock:
            engine = self._bound.pop(session_id, None)
            if engine is not None and engine in self._load:
                self._load[engine] -= 1
            self._tombstones.pop(session_id, None)
            self._tombstones[session_id] = (self._clock() + self._ttl, engine_id, reason)
            self._expire_locked()

    def release(self, session_id: str) -> None:
        """End one session's binding (or forget its tombstone). Unknown ids are ignored."""
        self.retire_sessions((session_id,))

    def retire_sessions(self, session_ids: Iterable[str]) -> int:
        """End many bindings; returns how many live bindings were ended."""
        ended = 0
        with self._lock:
            for session in session_ids:
                engine = self._bound.pop(session, None)
                if engine is not None:
                    ended += 1
                    if engine in self._load:
                        self._load[engine] -= 1
                else:
                    self._tombstones.pop(session, None)
        return ended

    def engine_of(self, session_id: str) -> str | None:
        with self._lock:
            return self._bound.get(session_id)

    def in_flight(self) -> dict[str, int]:
        """Live sessions bound to each live engine."""
        with self._lock:
            return dict(self._load)

    def requests_in_flight(self) -> dict[str, int]:
        """Estimated requests in flight per live engine (this router's, plus the others' last reported)."""
        with self._lock:
            return {e: self._own[e] + self._others[e] for e in self._load}

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            self._expire_locked()
            return {
                "engines": dict(self._load),
                "requests_in_flight": {e: self._own[e] + self._others[e] for e in self._load},
                "sessions": len(self._bound),
                "tombstones": len(self._tombstones),
                "max_sessions": self._max_sessions,
            }

    def _expire_locked(self) -> None:
        now = self._clock()
        while self._tombstones:
            session, (expires, _, _) = next(iter(self._tombstones.items()))
            if expires > now and len(self._tombstones) <= self._max_tombstones:
                break
            del self._tombstones[session]

    def __repr__(self) -> str:
        return (
            f"SessionAffinityRouter(engines={dict(self._load)}, sessions={len(self._bound)}, "
            f"tombstones={len(self._tombstones)})"
        )
