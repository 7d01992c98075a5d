"""Continuous batching, the pure part: which requests share the next forward step (`Batcher`), and which KV
pool rows each session holds (`SessionTable`: bounded, least-recently-used idle sessions are evicted into
tombstones with a reason). No torch and no asyncio here; the engine (`trainer.engine_runner`) drives both between steps.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from rollout.errors import RejectedBeforeGeneration, SessionGoneError


@dataclass
class Session:
    """One session's cache: its pool rows (one per sample), how many tokens they hold, and the last sampled
    token of each row (not yet fed through the model: it leads the next request's feed)."""

    rows: list[int]
    length: int = 0
    pending: list[int] | None = None
    version: int = 0
    last_used: float = 0.0
    busy: bool = False  # a request of this session is admitted and not finished
    ending: bool = False  # end() came while busy: free the rows when the request leaves


class SessionTable:
    """Sessions and the pool rows they hold, at most `rows` rows and `max_sessions` sessions."""

    def __init__(
        self,
        engine: str,
        rows: int,
        max_sessions: int,
        *,
        max_tombstones: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rows < 1 or max_sessions < 1:
            raise ValueError("rows and max_sessions must be at least 1")
        self.engine, self.rows, self.max_sessions = engine, rows, max_sessions
        self._free = list(range(rows))  # a heap: lowest rows first keeps the touched part of the pool small
        self._clock = clock
        self.sessions: dict[str, Session] = {}
        self._tombstones: OrderedDict[str, str] = OrderedDict()
        self._max_tombstones = max_tombstones
        self.evictions = 0

    def check(self, session_id: str, *, continues: bool, group: int) -> Session | None:
        """The session's cache, None for a new session; SessionGoneError when its cache is gone (evicted,
        aborted, or never here although the caller continues it); RejectedBeforeGeneration when unusable."""
        reason = self._tombstones.get(session_id)
        if reason is not None:
            raise SessionGoneError(session_id, self.engine, reason)
        sess = self.sessions.get(session_id)
        if sess is None:
            if continues:
                raise SessionGoneError(session_id, self.engine, "has no cache for this continuing session")
            if group > self.rows:
                raise RejectedBeforeGeneration(f"{group} rows exceed the engine's KV capacity of {self.rows} rows")
            return None
        if sess.busy:
            raise RejectedBeforeGeneration(f"session {session_id!r} already has a request in flight")
        if len(sess.rows) != group:
            raise RejectedBeforeGeneration(f"session {session_id!r} has {len(sess.rows)} rows, the request {group}")
        return sess

    def place(self, session_id: str, group: int) -> Session | None:
        """Rows for a new session, evicting least-recently-used idle sessions as needed; None: every row is
        held by a busy session right now (wait for one to finish)."""
        while len(self._free) < group or len(self.sessions) >= self.max_sessions:
            idle = [(s.last_used, sid) for sid, s in self.sessions.items() if not s.busy]
            if not idle:
                return None
            self.tombstone(min(idle)[1], "evicted: the engine's KV memory bound was reached")
            self.evictions += 1
        rows = [heapq.heappop(self._free) for _ in range(group)]
        sess = Session(rows=rows, last_used=self._clock())
        self.sessions[session_id] = sess
        return sess

    def touch(self, sess: Session) -> None:
        sess.last_used = self._clock()

    def end(self, session_id: str) -> None:
        """The caller is done with the session: free its rows (after its request, if one is in flight)."""
        self._tombstones.pop(session_id, None)
        sess = self.sessions.get(session_id)
        if sess is None:
            return
        if sess.busy:
            sess.ending = True
            return
        self._release(session_id)

    def finished(self, session_id: str) -> None:
        """A request of the session left the batch (its cache is consistent again)."""
        sess = self.sessions.get(session_id)
        if sess is not None:
            sess.busy = False
            sess.last_used = self._clock()
            if sess.ending:
                self._release(session_id)

    def tombstone(self, session_id: str, reason: str) -> None:
        """Drop the session's cache (a busy one's rows when its request leaves); its next request gets
        SessionGoneError with `reason` (the first reason given is kept)."""
        sess = self.sessions.get(session_id)
        if sess is not None and sess.busy:
            sess.ending = True
        elif sess is not None:
            self._release(session_id)
        reason = self._tombstones.pop(session_id, reason)
        self._tombstones[session_id] = reason
        while len(self._tombstones) > self._max_tombstones:
            self._tombstones.popitem(last=False)

    def _release(self, session_id: str) -> None:
        for row in self.sessions.pop(session_id).rows:
            heapq.heappush(self._free, row)

    @property
    def rows_used(self) -> int:
        return self.rows - len(self._free)

    @property
    def tombstones(self) -> int:
        return len(self._tombstones)


R = TypeVar("R")


@dataclass
class Batcher(Generic[R]):
    """Admission into a running batch of at most `max_batch` requests, oldest first; requests join and leave
    between steps. `place(request)` says whether a waiting request can get its KV rows now."""

    max_batch: int
    waiting: deque[R] = field(default_factory=deque)
    active: list[R] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")

    def submit(self, request: R) -> None:
        self.waiting.append(request)

    def admit(self, place: Callable[[R], bool]) -> list[R]:
        """Move waiting requests into the batch, oldest first, while there is room; one that cannot get its
        rows yet is skipped, not waited on (the rows it needs may be freed by a request behind it)."""
        joined: list[R] = []
        for request in list(self.waiting):
            if len(self.active) >= self.max_batch:
                break
            if place(request):
                self.waiting.remove(request)
                self.active.append(request)
                joined.append(request)
        return joined

    def retire(self, leaves: Callable[[R], bool]) -> list[R]:
        """Remove (and return) the active requests for which `leaves(request)` is true."""
        gone = [r for r in self.active if leaves(r)]
        if gone:
            self.active = [r for r in self.active if not leaves(r)]
        return gone

    def drop_waiting(self, leaves: Callable[[R], bool]) -> list[R]:
        gone = [r for r in self.waiting if leaves(r)]
        if gone:
            self.waiting = deque(r for r in self.waiting if not leaves(r))
        return gone

    @property
    def inflight(self) -> int:
        return len(self.waiting) + len(self.active)

    def __len__(self) -> int:
        return self.inflight

    def all(self) -> list[Any]:
        return [*self.active, *self.waiting]
