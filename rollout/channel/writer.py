"""Write-behind for an unbounded Ray channel: single-item puts are buffered locally and sent in batches.

A put returns at once; a daemon thread sends what accumulated every `linger_s` (or as soon as `max_items`
are waiting), one actor call per key run, in put order. Only for unbounded channels: a bounded put must see
fullness, so it cannot be deferred. A failed send is raised by the next put or flush.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

Entry = tuple[Any, float]


class WriteBehind:
    def __init__(
        self, send: Callable[[list[tuple[str, list[Entry]]]], None], linger_s: float, max_items: int = 1024
    ) -> None:
        if linger_s <= 0:
            raise ValueError("linger_s must be positive")
        self._send = send
        self._linger_s = linger_s
        self._max_items = max_items
        self._runs: list[tuple[str, list[Entry]]] = []  # consecutive puts to one key share a run
        self._count = 0
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()  # one sender at a time keeps put order
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="channel-write-behind", daemon=True)
        self._thread.start()

    def add(self, entries: list[Entry], key: str) -> None:
        with self._cond:
            self._raise_error_locked()
            if self._runs and self._runs[-1][0] == key:
                self._runs[-1][1].extend(entries)
            else:
                self._runs.append((key, list(entries)))
            self._count += len(entries)
            if self._count == len(entries) or self._count >= self._max_items:
                self._cond.notify()

    def flush(self) -> None:
        """Send everything buffered so far and wait for the channel to hold it."""
        self._send_pending()
        with self._cond:
            self._raise_error_locked()

    def _send_pending(self) -> None:
        with self._send_lock:
            with self._cond:
                runs, self._runs, self._count = self._runs, [], 0
            if runs:
                try:
                    self._send(runs)
                except BaseException as exc:  # noqa: BLE001 - kept for the producer's next call
                    with self._cond:
                        self._error = exc

    def close(self) -> None:
        try:
            self.flush()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._runs and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                if self._count < self._max_items:
                    # Linger: let more puts join this batch.
                    self._cond.wait(self._linger_s)
            self._send_pending()

    def _raise_error_locked(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
