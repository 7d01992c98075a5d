"""The channel's queues: one FIFO per key, weights, maxsize; non-blocking ops plus wake-ups.

Used directly by a local channel and inside the named Ray actor. Thread-safe; waiters (threads or asyncio
tasks) are woken on every change. Every take happens in the caller's own call, so a cancelled waiter loses
nothing.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from typing import Any

from rollout.channel.hooks import ChannelContext, Collector, resolve_hook
from rollout.errors import ChannelError

DEFAULT_KEY = "default"
Entry = tuple[Any, float]  # (item, weight)


def check_weight(weight: Any) -> float:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise ChannelError(f"weight must be a number, got {type(weight).__name__}")
    if not math.isfinite(weight) or weight < 0:
        raise ChannelError(f"weight must be finite and >= 0, got {weight}")
    return float(weight)


class ChannelState:
    def __init__(
        self,
        name: str,
        *,
        maxsize: int = 0,
        collector: Any = None,
        hook_options: dict[str, Any] | None = None,
        cfg: Any = None,
    ) -> None:
        if maxsize < 0:
            raise ChannelError("maxsize must be >= 0 (0: unbounded)")
        self.name = name
        self.maxsize = maxsize
        ctx = ChannelContext(name, dict(hook_options or {}), cfg)
        self.collector = resolve_hook(collector, ctx)
        self._passthrough = type(self.collector).collect is Collector.collect
        self._queues: dict[str, deque[Entry]] = {}
        self._lock = threading.Lock()
        self.cond = threading.Condition(self._lock)
        self._version = 0
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None], int]] = []
        self.closed = False

    # --- put ----------------------------------------------------------------------------------------------
    def prepare(self, entries: list[Entry], key: str) -> list[tuple[str, Any, float]]:
        """Run the collector once per item (before any waiting, so hooks never run twice)."""
        out: list[tuple[str, Any, float]] = []
        for item, weight in entries:
            weight = check_weight(weight)
            if self._passthrough:
                out.append((key, item, weight))
                continue
            for produced in self.collector.collect(item, key):
                if len(produced) == 3:
                    out.append((produced[0], produced[1], check_weight(produced[2])))
                else:
                    out.append((produced[0], produced[1], weight))
        return out

    def try_enqueue_locked(self, prepared: list[tuple[str, Any, float]]) -> bool:
        if self.closed:
            raise ChannelError(f"channel {self.name!r} is closed")
        if self.maxsize:
            need: dict[str, int] = {}
            for key, _, _ in prepared:
                need[key] = need.get(key, 0) + 1
            for key, n in need.items():
                count = len(self._queues.get(key, ()))
                # A batch larger than maxsize is admitted into an empty key instead of waiting forever.
                if count and count + n > self.maxsize:
                    return False
        for key, item, weight in prepared:
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = deque()
            queue.append((item, weight))
        if prepared:
            self._changed_locked()
        return True

    # --- get ----------------------------------------------------------------------------------------------
    def try_take_locked(self, key: str, target_weight: float | None, max_items: int) -> list[Any] | None:
        """Up to max_items from the key's queue; with target_weight, the first item always, then while the total
        fits."""
        if self.closed:
            raise ChannelError(f"channel {self.name!r} is closed")
        queue = self._queues.get(key)
        if not queue:
            return None
        items: list[Any] = []
        total = 0.0
        while queue and len(items) < max_items:
            weight = queue[0][1]
            if items and target_weight is not None and total + weight > target_weight:
                break
            items.append(queue.popleft()[0])
            total += weight
        self._changed_locked()
        return items

    # --- sizes --------------------------------------------------------------------------------------------
    def qsize(self, key: str = DEFAULT_KEY) -> int:
        with self._lock:
            return len(self._queues.get(key, ()))

    def full(self, key: str = DEFAULT_KEY) -> bool:
        with self._lock:
            return bool(self.maxsize) and len(self._queues.get(key, ())) >= self.maxsize

    def metrics(self) -> dict[str, float]:
        """Items queued per key (`<key>/queued`) and the collector's own counts."""
        with self._lock:
            queued = {f"{key}/queued": float(len(queue)) for key, queue in self._queues.items()}
        return {**queued, **self.collector.metrics()}

    def describe(self) -> str:
        with self._lock:
            keys = {k: len(q) for k, q in self._queues.items() if q}
        bound = f"maxsize={self.maxsize}" if self.maxsize else "unbounded"
        return f"Channel({self.name!r}, {bound}, collector={type(self.collector).__name__}, queued={keys})"

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._changed_locked()

    # --- wake-ups -----------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    def _changed_locked(self) -> None:
        self._version += 1
        self.cond.notify_all()
        if self._async_waiters:
            waiters, self._async_waiters = self._async_waiters, []
            for loop, fut, _ in waiters:
                loop.call_soon_threadsafe(_wake, fut)

    async def wait_change(self, seen_version: int) -> None:
        """Return once the state changed after `seen_version` (the version read with the failed attempt)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:
            if self._version != seen_version:
                return
            self._async_waiters.append((loop, fut, seen_version))
        await fut


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
