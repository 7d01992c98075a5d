"""Waiting on a condition instead of sleeping: poll until it holds, or fail loudly at the deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest


def wait_until(check: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.01) -> Any:
    """The first truthy value of `check()`; fails the test naming `what` if none comes within `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}", pytrace=False)
        time.sleep(interval)


async def wait_until_async(check: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.01) -> Any:
    """wait_until for async tests: polls without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}", pytrace=False)
        await asyncio.sleep(interval)
