"""Channel: a keyed, weighted FIFO shared by producers and consumers, in-process (local) or via a named Ray actor.

This module owns the client: the local registry, create/connect/close, and routing each put/get/size call to the
in-process state (`ops`) or the actor. Argument checks and result codes are `calls`; the actor itself, and
starting and finding it, are `actor`; write-behind puts are `writer`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from typing import Any

from rollout.channel import actor as channel_actor
from rollout.channel import calls, ops
from rollout.channel.state import DEFAULT_KEY, ChannelState, Entry, check_weight
from rollout.channel.writer import WriteBehind
from rollout.errors import ChannelError

_LOCAL: dict[str, ChannelState] = {}
_LOCAL_LOCK = threading.Lock()


class Channel:
    """Use Channel.create / Channel.connect. Sync methods block the calling thread; *_async ones await."""

    def __init__(
        self, name: str, *, state: ChannelState | None = None, actor: Any = None, linger_ms: float = 0.0
    ) -> None:
        self.name = name
        self._state = state
        self._actor = actor
        self._linger_ms = linger_ms
        self._writer: WriteBehind | None = None

    # --- lifecycle ----------------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        name: str,
        *,
        maxsize: int = 0,
        local: bool = False,
        collector: Any = None,
        hook_options: dict[str, Any] | None = None,
        cfg: Any = None,
        namespace: str | None = None,
        actor_options: dict[str, Any] | None = None,
        linger_ms: float = 0.0,
    ) -> Channel:
        """A new channel. local=True: this process only; otherwise a named Ray actor any process can connect to.

        linger_ms > 0 (unbounded Ray channels only): this client's puts are written behind, see writer.py.
        """
        calls.check_linger(linger_ms, maxsize, local)
        kwargs = {
            "maxsize": maxsize,
            "collector": collector,
            "hook_options": hook_options,
            "cfg": cfg,
        }
        if local:
            with _LOCAL_LOCK:
                if name in _LOCAL:
                    raise ChannelError(f"a local channel named {name!r} already exists in this process")
                state = _LOCAL[name] = ChannelState(name, **kwargs)
            return cls(name, state=state)
        actor = channel_actor.spawn(name, kwargs, namespace, actor_options)
        return cls(name, actor=actor, linger_ms=linger_ms)

    @classmethod
    def connect(cls, name: str, *, namespace: str | None = None, linger_ms: float = 0.0) -> Channel:
        """An existing channel: a local one of this process first, else the named Ray actor."""
        with _LOCAL_LOCK:
            state = _LOCAL.get(name)
        if state is not None:
            calls.check_linger(linger_ms, state.maxsize, True)
            return cls(name, state=state)
        actor = channel_actor.find(name, namespace)
        if linger_ms:
            import ray

            calls.check_linger(linger_ms, ray.get(actor.maxsize.remote()), False)
        return cls(name, actor=actor, linger_ms=linger_ms)

    def flush(self) -> None:
        """Send this client's written-behind puts now (no-op without linger_ms)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Close the channel for everyone: waiting calls raise ChannelError; on a Ray channel the actor is then
        killed, so later calls from other clients raise Ray's RayActorError."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._state is not None:
            self._state.close()
            with _LOCAL_LOCK:
                _LOCAL.pop(self.name, None)
        else:
            import ray

            ray.get(self._actor.close.remote())
            ray.kill(self._actor)

    @property
    def is_local(self) -> bool:
        return self._state is not None

    def __reduce__(self) -> Any:
        if self._state is not None:
            raise ChannelError(f"local channel {self.name!r} cannot leave its process; create it with local=False")
        return (
            Channel,
            (self.name,),
            {"_actor": self._actor, "_state": None, "_linger_ms": self._linger_ms, "_writer": None},
        )

    # --- put ----------------------------------------------------------------------------------------------
    def put(self, item: Any, weight: float = 0, key: str = DEFAULT_KEY, timeout: float | None = None) -> None:
        self._put_sync([(item, check_weight(weight))], key, timeout, False)

    def put_nowait(self, item: Any, weight: float = 0, key: str = DEFAULT_KEY) -> None:
        self._put_sync([(item, check_weight(weight))], key, None, True)

    def put_many(
        self,
        items: Iterable[Any],
        weights: Iterable[float] | None = None,
        key: str = DEFAULT_KEY,
        timeout: float | None = None,
    ) -> None:
        """Many items in one call (one actor round trip): what a producer of many small items should use."""
        self._put_sync(calls.entries(items, weights), key, timeout, False)

    async def put_async(
        self, item: Any, weight: float = 0, key: str = DEFAULT_KEY, timeout: float | None = None
    ) -> None:
        await self._put_async([(item, check_weight(weight))], key, timeout)

    async def put_many_async(
        self,
        items: Iterable[Any],
        weights: Iterable[float] | None = None,
        key: str = DEFAULT_KEY,
        timeout: float | None = None,
    ) -> None:
        await self._put_async(calls.entries(items, weights), key, timeout)

    def _put_sync(self, entries: list[Entry], key: str, timeout: float | None, nowait: bool) -> None:
        if self._linger_ms:
            self._write_behind().add(entries, key)  # unbounded: never full, never waits
            return
        if self._state is not None:
            code = ops.put_blocking(self._state, entries, key, timeout, nowait)
        else:
            import ray

            code = ray.get(self._actor.put.remote(entries, key, timeout, nowait))
        calls.raise_put(code, self.name, key, timeout)

    async def _put_async(self, entries: list[Entry], key: str, timeout: float | None) -> None:
        if self._linger_ms:
            self._write_behind().add(entries, key)
            return
        if self._state is not None:
            code = await ops.put_waiting(self._state, entries, key, timeout, False)
        else:
            code = await self._actor.put.remote(entries, key, timeout, False)
        calls.raise_put(code, self.name, key, timeout)

    # --- get ----------------------------------------------------------------------------------------------
    def get(self, key: str = DEFAULT_KEY, timeout: float | None = None) -> Any:
        return self._take_sync(key, None, 1, timeout, False)[0]

    def get_nowait(self, key: str = DEFAULT_KEY) -> Any:
        return self._take_sync(key, None, 1, None, True)[0]

    def get_many(self, max_items: int, key: str = DEFAULT_KEY, timeout: float | None = None) -> list[Any]:
        """At least one and at most max_items items, in FIFO order, in one call."""
        return self._take_sync(key, None, calls.positive(max_items), timeout, False)

    def get_batch(
        self,
        target_weight: float,
        key: str = DEFAULT_KEY,
        timeout: float | None = None,
        max_items: int | None = None,
    ) -> list[Any]:
        """Blocks for at least one item; the first always comes, then more while the total <= target_weight."""
        return self._take_sync(key, calls.target(target_weight), calls.cap(max_items), timeout, False)

    async def get_async(self, key: str = DEFAULT_KEY, timeout: float | None = None) -> Any:
        return (await self._take_async(key, None, 1, timeout))[0]

    async def get_many_async(self, max_items: int, key: str = DEFAULT_KEY, timeout: float | None = None) -> list[Any]:
        return await self._take_async(key, None, calls.positive(max_items), timeout)

    async def get_batch_async(
        self,
        target_weight: float,
        key: str = DEFAULT_KEY,
        timeout: float | None = None,
        max_items: int | None = None,
    ) -> list[Any]:
        return await self._take_async(key, calls.target(target_weight), calls.cap(max_items), timeout)

    def _write_behind(self) -> WriteBehind:
        if self._writer is None:
            actor = self._actor

            def send(runs: list[tuple[str, list[Entry]]]) -> None:
                import ray

                # Actor calls from one caller run in submission order, so put order is kept.
                ray.get([actor.put.remote(entries, key, None, False) for key, entries in runs])

            self._writer = WriteBehind(send, self._linger_ms / 1000.0)
        return self._writer

    def _take_sync(
        self, key: str, target: float | None, max_items: int, timeout: float | None, nowait: bool
    ) -> list[Any]:
        self.flush()  # read your own writes
        if self._state is not None:
            code, items = ops.take_blocking(self._state, key, target, max_items, timeout, nowait)
        else:
            import ray

            code, items = ray.get(self._actor.take.remote(key, target, max_items, timeout, nowait))
        calls.raise_take(code, self.name, key, timeout)
        return items

    async def _take_async(self, key: str, target: float | None, max_items: int, timeout: float | None) -> list[Any]:
        # Cancelling an awaiting get on a Ray channel cannot un-take an item the actor already handed out:
        # prefer a timeout over cancellation there.
        if self._writer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.flush)
        if self._state is not None:
            code, items = await ops.take_waiting(self._state, key, target, max_items, timeout, False)
        else:
            code, items = await self._actor.take.remote(key, target, max_items, timeout, False)
        calls.raise_take(code, self.name, key, timeout)
        return items

    # --- sizes --------------------------------------------------------------------------------------------
    def qsize(self, key: str = DEFAULT_KEY) -> int:
        """Items under `key`."""
        if self._state is not None:
            return self._state.qsize(key)
        self.flush()
        import ray

        size: int = ray.get(self._actor.qsize.remote(key))
        return size

    def empty(self, key: str = DEFAULT_KEY) -> bool:
        return self.qsize(key) == 0

    def full(self, key: str = DEFAULT_KEY) -> bool:
        if self._state is not None:
            return self._state.full(key)
        import ray

        full: bool = ray.get(self._actor.full.remote(key))
        return full

    def metrics(self) -> dict[str, float]:
        """Items queued per key and what the collector counted (Collector.metrics): what the run reports."""
        if self._state is not None:
            return self._state.metrics()
        import ray

        metrics: dict[str, float] = ray.get(self._actor.metrics.remote())
        return metrics

    def __repr__(self) -> str:
        if self._state is not None:
            return self._state.describe().replace("Channel(", "Channel[local](", 1)
        try:
            import ray

            described: str = ray.get(self._actor.describe.remote(), timeout=5)
            return described.replace("Channel(", "Channel[ray](", 1)
        except Exception as exc:  # noqa: BLE001 - repr must not raise
            return f"Channel[ray]({self.name!r}, unreachable: {exc!r})"
