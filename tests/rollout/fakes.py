"""In-process fakes for scheduler unit tests: a deterministic group source and controllable workers."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable
from typing import Any

from rollout.errors import WorkerLostError
from rollout.types import GroupResult


class CountingSource:
    """Infinite source of integer group ids; returned groups are handed out again first."""

    def __init__(self, limit: int | None = None) -> None:
        self.next_id = 0
        self.backlog: list[int] = []
        self.limit = limit
        self.handed_out = 0
        self.returned: list[int] = []
        self.lock = threading.Lock()

    def get_groups(self, n: int) -> list[int]:
        with self.lock:
            out, self.backlog = self.backlog[:n], self.backlog[n:]
            while len(out) < n and (self.limit is None or self.next_id < self.limit):
                out.append(self.next_id)
                self.next_id += 1
            self.handed_out += len(out)
            return out

    def return_groups(self, groups: list[int]) -> None:
        with self.lock:
            self.returned.extend(groups)
            self.backlog = list(groups) + self.backlog

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return {"next_id": self.next_id, "backlog": list(self.backlog)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_id = state["next_id"]
        self.backlog = list(state["backlog"])


def default_result(group: int) -> GroupResult:
    # Only every third group has different rewards; the others have zero variance.
    return GroupResult(rewards=[float(group % 3 != 0), 1.0], group_id=group, payload={"prompt": group})


class InstantWorker:
    def __init__(self, make: Callable[[int], GroupResult] = default_result) -> None:
        self.make = make
        self.calls: list[int] = []

    def generate_group(self, group: int, batch_id: Any) -> GroupResult:
        self.calls.append(group)
        return self.make(group)


class PooledWorker:
    """Completes each group on a thread after `delay(group)` seconds; can be made to die."""

    def __init__(
        self, make: Callable[[int], GroupResult] = default_result, delay: Callable[[int], float] = lambda g: 0.001
    ) -> None:
        self.make = make
        self.delay = delay
        self.pool = cf.ThreadPoolExecutor(4)
        self.dead = threading.Event()

    def generate_group(self, group: int, batch_id: Any) -> cf.Future:
        def work() -> GroupResult:
            deadline = time.monotonic() + self.delay(group)
            while time.monotonic() < deadline:
                if self.dead.wait(0.001):
                    break
            if self.dead.is_set():
                raise WorkerLostError(self, "killed")
            return self.make(group)

        return self.pool.submit(work)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class ManualWorker:
    """Each call returns a Future the test completes by hand."""

    def __init__(self) -> None:
        self.futures: dict[int, cf.Future] = {}
        self.lock = threading.Lock()

    def generate_group(self, group: int, batch_id: Any) -> cf.Future:
        fut: cf.Future = cf.Future()
        with self.lock:
            self.futures[group] = fut
        return fut

    def finish(self, group: int, result: GroupResult | None = None) -> None:
        with self.lock:
            fut = self.futures.pop(group)
        fut.set_result(result or default_result(group))

    def open_groups(self) -> list[int]:
        with self.lock:
            return sorted(self.futures)


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.002)
