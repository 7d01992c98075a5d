"""The client side of one Channel call: checking its arguments before anything is sent, and turning the
result code the state (`ops`) or the actor answers with into the queue exception the caller sees."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rollout.channel import ops
from rollout.channel.state import Entry, check_weight
from rollout.errors import ChannelError, QueueEmpty, QueueFull


def check_linger(linger_ms: float, maxsize: int, local: bool) -> None:
    if linger_ms < 0:
        raise ChannelError("linger_ms must be >= 0")
    if linger_ms and (maxsize or local):
        raise ChannelError(
            "linger_ms (write-behind) needs an unbounded Ray channel: a bounded put must see "
            "fullness and a local put is already cheap"
        )


def entries(items: Iterable[Any], weights: Iterable[float] | None) -> list[Entry]:
    items = list(items)
    if weights is None:
        return [(item, 0.0) for item in items]
    weights = [check_weight(w) for w in weights]
    if len(weights) != len(items):
        raise ChannelError(f"{len(items)} items but {len(weights)} weights")
    return list(zip(items, weights))


def target(target_weight: float) -> float:
    if isinstance(target_weight, bool) or not isinstance(target_weight, (int, float)) or not target_weight > 0:
        raise ChannelError(f"target_weight must be a positive number, got {target_weight!r}")
    return float(target_weight)


def positive(n: int) -> int:
    if not isinstance(n, int) or n < 1:
        raise ChannelError(f"max_items must be a positive integer, got {n!r}")
    return n


def cap(max_items: int | None) -> int:
    return 1 << 62 if max_items is None else positive(max_items)


def raise_put(code: int, name: str, key: str, timeout: float | None) -> None:
    if code == ops.NOT_NOW:
        raise QueueFull(f"channel {name!r} key {key!r} is full")
    if code == ops.TIMED_OUT:
        raise TimeoutError(f"channel {name!r} key {key!r} stayed full for {timeout} s")


def raise_take(code: int, name: str, key: str, timeout: float | None) -> None:
    if code == ops.NOT_NOW:
        raise QueueEmpty(f"channel {name!r} key {key!r} is empty")
    if code == ops.TIMED_OUT:
        raise TimeoutError(f"channel {name!r} key {key!r} stayed empty for {timeout} s")
