"""The channel's queues: keys, per-consumer private queues, weights, maxsize; non-blocking ops plus wake-ups.

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
        dispatcher: Any = None,
        consumers: tuple[str, ...] = (),
        hook_options: dict[str, Any] | None = None,
        cfg: Any = None,
    ) -> None:
        if maxsize < 0:
            raise ChannelError("maxsize must be >= 0 (0: unbounded)")
        self.name = name
        self.maxsize = maxsize
        self.consumers = tuple(consumers)
        ctx = ChannelContext(name, self.consumers, dict(hook_options or {}), cfg)
        self.collector = resolve_hook(collector, "collector", ctx)
        self.dispatcher = resolve_hook(dispatcher, "dispatcher", ctx)
        self._passthrough = type(self.collector).collect is Collector.collect
        self._deals = self.dispatcher.deals
        self._queues: dict[str, dict[str | None, deque[Entry]]] = {}
        self._counts: dict[str, int] = {}
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
                count = self._counts.get(key, 0)
                # A batch larger than maxsize is admitted into an empty key instead of waiting forever.
                if count and count + n > self.maxsize:
                    return False
        for key, item, weight in prepared:
            consumer = self.dispatcher.route(item, key) if self._deals else None
            if consumer is not None and consumer not in self.consumers:
                raise ChannelError(f"dispatcher routed to unknown consumer {consumer!r}")
            queues = self._queues.get(key)
            if queues is None:
                queues = self._queues[key] = {}
            queue = queues.get(consumer)
            if queue is None:
                queue = queues[consumer] = deque()
            queue.append((item, weight))
            self._counts[key] = self._counts.get(key, 0) + 1
        if prepared:
            self._changed_locked()
        return True

    # --- get ----------------------------------------------------------------------------------------------
    def try_take_locked(
        self, key: str, consumer: str | None, target_weight: float | None, max_items: int, rebalance: bool
    ) -> list[Any] | None:
        """Up to max_items from one queue; with target_weight, the first item always, then while the total fits."""
        if self.closed:
            raise ChannelError(f"channel {self.name!r} is closed")
        if consumer is not None and self._deals and consumer not in self.consumers:
            raise ChannelError(f"unknown consumer {consumer!r}; this channel knows {list(self.consumers)}")
        queues = self._queues.get(key)
        if not queues or not self._counts.get(key):
            return None
        queue = self._pick_queue_locked(key, queues, consumer, rebalance)
        if queue is None:
            return None
        items: list[Any] = []
        total = 0.0
        while queue and len(items) < max_items:
            weight = queue[0][1]
            if items and target_weight is not None and total + weight > target_weight:
                break
            items.append(queue.popleft()[0])
            total += weight
            if (
                consumer is not None
                and rebalance
                and queue is not queues.get(consumer)
                and queue is not queues.get(None)
            ):
                break  # a steal takes one item only
        self._counts[key] -= len(items)
        self._changed_locked()
        return items

    def _pick_queue_locked(
        self, key: str, queues: dict[str | None, deque[Entry]], consumer: str | None, rebalance: bool
    ) -> deque[Entry] | None:
        candidates = [consumer, None] if consumer is not None else [None, *self.consumers]
        for owner in candidates:
            queue = queues.get(owner)
            if queue:
                return queue
        if consumer is not None and rebalance and self._deals:
            depths = {c: len(q) for c, q in queues.items() if c is not None}
            donor = self.dispatcher.rebalance(key, consumer, depths)
            if donor is not None and queues.get(donor):
                return queues[donor]
        return None

    # --- sizes --------------------------------------------------------------------------------------------
    def qsize(self, key: str = DEFAULT_KEY, consumer: str | None = None) -> int:
        with self._lock:
            if consumer is None:
                return self._counts.get(key, 0)
            return len(self._queues.get(key, {}).get(consumer, ()))

    def full(self, key: str = DEFAULT_KEY) -> bool:
        with self._lock:
            return bool(self.maxsize) and self._counts.get(key, 0) >= self.maxsize

    def describe(self) -> str:
        with self._lock:
            keys = {k: {(c or "shared"): len(q) for c, q in qs.items() if q} for k, qs in self._queues.items()}
            keys = {k: v for k, v in keys.items() if v}
        bound = f"maxsize={self.maxsize}" if self.maxsize else "unbounded"
        return (
            f"Channel({self.name!r}, {bound}, collector={type(self.collector).__name__}, "
            f"dispatcher={type(self.dispatcher).__name__}, queued={keys})"
        )

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
