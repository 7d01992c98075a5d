"""ChannelActor: a ChannelState served by a named, async Ray actor, so producers and consumers in other processes
share it.

Plain class; `ray.remote` is applied in Channel.create (Ray stays at the edge).
"""

from __future__ import annotations

from typing import Any

from rollout.channel import ops
from rollout.channel.state import ChannelState, Entry


class ChannelActor:
    def __init__(self, name: str, kwargs: dict[str, Any]) -> None:
        self.state = ChannelState(name, **kwargs)

    async def put(self, entries: list[Entry], key: str, timeout: float | None, nowait: bool) -> int:
        return await ops.put_waiting(self.state, entries, key, timeout, nowait)

    async def take(
        self,
        key: str,
        consumer: str | None,
        target_weight: float | None,
        max_items: int,
        timeout: float | None,
        nowait: bool,
    ) -> tuple[int, list[Any]]:
        return await ops.take_waiting(self.state, key, consumer, target_weight, max_items, timeout, nowait)

    async def qsize(self, key: str, consumer: str | None) -> int:
        return self.state.qsize(key, consumer)

    async def maxsize(self) -> int:
        return self.state.maxsize

    async def full(self, key: str) -> bool:
        return self.state.full(key)

    async def describe(self) -> str:
        return self.state.describe()

    async def close(self) -> None:
        self.state.close()
