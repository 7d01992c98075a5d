"""Blocking (thread) and waiting (asyncio) put/take on a ChannelState, returning status codes, not raising.

Status codes instead of exceptions keep the Ray actor's replies small and unwrapped; the client raises.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rollout.channel.state import ChannelState, Entry

OK, NOT_NOW, TIMED_OUT = 0, 1, 2  # NOT_NOW: full (put) or empty (get) with nowait


def put_blocking(state: ChannelState, entries: list[Entry], key: str, timeout: float | None, nowait: bool) -> int:
    prepared = state.prepare(entries, key)
    deadline = None if timeout is None else time.monotonic() + timeout
    with state.cond:
        while not state.try_enqueue_locked(prepared):
            if nowait:
                return NOT_NOW
            if deadline is None:
                state.cond.wait()
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return TIMED_OUT
                state.cond.wait(remaining)
    return OK


async def put_waiting(state: ChannelState, entries: list[Entry], key: str, timeout: float | None, nowait: bool) -> int:
    prepared = state.prepare(entries, key)
    try:
        async with asyncio.timeout(timeout):
            while True:
                with state.cond:
                    if state.try_enqueue_locked(prepared):
                        return OK
                    seen = state.version
                if nowait:
                    return NOT_NOW
                await state.wait_change(seen)
    except TimeoutError:
        return TIMED_OUT


def take_blocking(
    state: ChannelState,
    key: str,
    target_weight: float | None,
    max_items: int,
    timeout: float | None,
    nowait: bool,
) -> tuple[int, list[Any]]:
    deadline = None if timeout is None else time.monotonic() + timeout
    with state.cond:
        while True:
            items = state.try_take_locked(key, target_weight, max_items)
            if items:
                return OK, items
            if nowait:
                return NOT_NOW, []
            if deadline is None:
                state.cond.wait()
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return TIMED_OUT, []
                state.cond.wait(remaining)


async def take_waiting(
    state: ChannelState,
    key: str,
    target_weight: float | None,
    max_items: int,
    timeout: float | None,
    nowait: bool,
) -> tuple[int, list[Any]]:
    try:
        async with asyncio.timeout(timeout):
            while True:
                with state.cond:
                    items = state.try_take_locked(key, target_weight, max_items)
                    seen = state.version
                if items:
                    return OK, items
                if nowait:
                    return NOT_NOW, []
                await state.wait_change(seen)
    except TimeoutError:
        return TIMED_OUT, []
