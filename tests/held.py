"""Expensive test resources held across the tests that use them (one Chromium and one daphne for all the browser
tests in a row, one `make run` platform for the tests that can go on with it), instead of one per module or
test: a fixture takes the resource from its `Held`, and tests/conftest.py releases it as soon as no test that
requests that fixture comes next (keep="next": a Playwright event loop left running would make every later ORM
call and asyncio.run fail) or later (keep="last")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Literal, TypeVar

import pytest

T = TypeVar("T")


class Held(Generic[T]):
    """One resource, started on first use and kept until `release()`; `fixture` names the fixture whose tests
    keep it (release_unneeded)."""

    def __init__(self, fixture: str, stop: Callable[[T], None], keep: Literal["next", "last"] = "next") -> None:
        self.fixture = fixture
        self.keep = keep
        self._stop = stop
        self._value: T | None = None
        HELD.append(self)

    def get(self, start: Callable[[], T]) -> T:
        if self._value is None:
            self._value = start()
        return self._value

    def put(self, value: T) -> None:
        """Hold a resource started elsewhere (the one held before, if any, is released)."""
        self.release()
        self._value = value

    def take(self) -> T | None:
        """The resource, if one is held, handed over for good: the caller stops it."""
        value, self._value = self._value, None
        return value

    def release(self) -> None:
        value = self.take()
        if value is not None:
            self._stop(value)


HELD: list[Held] = []


# The session's test order, for keep="last": (items, index of each item, last index at which each fixture is used).
_order: tuple[list[pytest.Item], dict[int, int], dict[str, int]] | None = None


def _needed_later(fixture: str, nextitem: pytest.Item) -> bool:
    global _order
    items = nextitem.session.items
    if _order is None or _order[0] is not items:
        last = {name: i for i, item in enumerate(items) for name in getattr(item, "fixturenames", ())}
        _order = (items, {id(item): i for i, item in enumerate(items)}, last)
    _, index, last = _order
    return index.get(id(nextitem), len(items)) <= last.get(fixture, -1)


def release_unneeded(nextitem: pytest.Item | None) -> None:
    """After a test's teardown: release what the next test (None: there is none), or with keep="last" every later
    one, does not request."""
    for held in HELD:
        if nextitem is None:
            held.release()
        elif held.keep == "next" and held.fixture not in nextitem.fixturenames:
            held.release()
        elif held.keep == "last" and not _needed_later(held.fixture, nextitem):
            held.release()
