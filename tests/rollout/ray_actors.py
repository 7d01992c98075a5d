"""Small Ray actor classes for the rollout integration tests (importable by Ray workers; no pytest imports)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from rollout.gate import RequestGate
from rollout.types import GroupResult


class GroupWorker:
    """A rollout worker: with hang=True group 0 never finishes and group 1 waits for release(); others at once."""

    def __init__(self, hang: bool = False) -> None:
        self.hang = hang
        self.done: list[int] = []
        self.go = asyncio.Event()

    async def generate_group(self, group: int, batch_id: Any) -> GroupResult:
        if group == 0 and self.hang:
            await asyncio.sleep(3600)
        if group == 1 and self.hang:
            await self.go.wait()
        self.done.append(group)
        return GroupResult(rewards=[0.0, 1.0], group_id=group, meta={"pid": os.getpid()})

    async def release(self) -> None:
        self.go.set()

    def finished(self) -> list[int]:
        return list(self.done)

    def close(self) -> None:
        pass


class GatedEngine:
    """An inference engine actor exposing the publication handle protocol over its RequestGate."""

    def __init__(self, name: str) -> None:
        self.gate = RequestGate(name)
        self.weights: Any = None

    async def generate(self, session_id: str, prompt: str) -> dict:
        async with self.gate.lease(session_id, timeout=10) as lease:
            await asyncio.sleep(0.005)
            return {"text": prompt[::-1], "version": lease.version, "request_id": lease.request_id}

    def seal(self) -> None:
        self.gate.seal()

    async def drain(self, timeout_s: float) -> int:
        return await self.gate.drain(timeout_s)

    async def install_version(self, version: int, weights: Any = None) -> None:
        self.gate.install_version(version)
        self.weights = weights

    def reopen(self) -> int:
        return self.gate.reopen()

    def snapshot(self) -> dict:
        return self.gate.snapshot()


class ChannelProducer:
    def produce(self, channel: Any, n: int, chunk: int) -> int:
        from rollout.channel import Channel

        channel = channel if channel is not None else Channel.connect("ray-chan")
        for start in range(0, n, chunk):
            channel.put_many(range(start, min(n, start + chunk)), weights=[1] * (min(n, start + chunk) - start))
        return n

    def produce_single(self, n: int, linger_ms: float) -> int:
        from rollout.channel import Channel

        channel = Channel.connect("ray-chan", linger_ms=linger_ms)
        for i in range(n):
            channel.put(f"single-{i}")  # a string: the test channel splits lists and tuples
        channel.flush()
        return n
