"""RolloutScheduler: feeds prompt groups to rollout workers and collects exactly batch_size kept groups per batch.

A background thread owns dispatch and result collection (SchedulerCore holds the rules); the trainer calls
generate(), claim(), pause(), state_dict() from its own thread. With `claims=True` results are receipts for
groups the workers put into a channel, and the channel's consumer claims what it took.

Here: the calls the trainer makes. The background thread is `rollout.scheduler_loop.SchedulerLoop`, which
RolloutScheduler extends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from rollout.errors import NoWorkerLeftError, QuiesceTimeoutError, SchedulerClosedError, SchedulerStateError
from rollout.filters import GroupFilter
from rollout.invoke_workers import make_invoker
from rollout.scheduler_core import SchedulerCore, rollout_batch
from rollout.scheduler_loop import SchedulerLoop
from rollout.types import RolloutBatch


class GroupSource(Protocol):
    """The trainer's sampler: hands out prompt groups and takes back the ones that were not delivered."""

    def get_groups(self, n: int) -> list[Any]: ...

    def return_groups(self, groups: list[Any]) -> None: ...


class RolloutScheduler(SchedulerLoop):
    def __init__(
        self,
        workers: list[Any],
        capacities: list[int],
        source: GroupSource,
        batch_size: int,
        *,
        filters: list[GroupFilter] | None = None,
        poll_interval_s: float = 0.01,
        claims: bool = False,
    ) -> None:
        if len(workers) != len(capacities):
            raise ValueError(f"{len(workers)} workers but {len(capacities)} capacities")
        self.workers = list(workers)
        self._core = SchedulerCore(capacities, batch_size, claims=claims)
        self._invoker = make_invoker(self.workers)
        self._source = source
        self._filters = list(filters or [])
        self._poll = poll_interval_s
        self._cond = threading.Condition()
        self._batch_id: Any = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._starved = False  # the source gave fewer groups than asked on the last dispatch

    # --- trainer-facing API -------------------------------------------------------------------------------
    def generate(self, batch_id: Any, prefetch: int = 0, size: int | None = None) -> RolloutBatch:
        """Block until batch_size (or `size`) kept groups are collected; filtered groups are replaced."""
        with self._cond:
            self._raise_if_unusable()
            self._core.start_batch(prefetch, size)
            self._batch_id = batch_id
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rollout-scheduler", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            while not self._core.collect():
                if self._error is not None or self._closed:
                    self._core.abandon_batch()
                    self._raise_if_unusable()
                self._cond.wait()
            groups, dropped, aborted = self._core.finish_batch()
            self._cond.notify_all()  # demand fell: the loop may prefetch again
        return rollout_batch(batch_id, groups, dropped, aborted)

    def claim(self, items: list[tuple[Any, Any, bool]], timeout_s: float = 60.0) -> list[str]:
        """Verdicts on the items a channel's consumer took (SchedulerCore.claim); a receipt still on its way
        (the worker puts before it returns) is waited for, up to `timeout_s`."""
        ids = {group_id for group_id, _, _ in items}
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._core.pending_group(ids):
                self._raise_if_unusable()
                if time.monotonic() >= deadline:
                    raise SchedulerStateError(f"claim(): receipts of groups {sorted(ids)} not in after {timeout_s} s")
                self._cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            verdicts = self._core.claim(items)
            self._cond.notify_all()  # fewer undelivered results: the loop may dispatch again
        self._flush_returns()
        return verdicts

    def pause(self, *, drain: bool = True) -> bool:
        """Stop dispatching; with drain, return only once every in-flight call has settled. Returns was-paused."""
        with self._cond:
            was_paused = self._core.paused
            self._core.paused = True
            self._cond.notify_all()
            while drain and self._core.pending and self._error is None and not self._closed:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            return was_paused

    def quiesce(self, timeout_s: float, abort: Callable[[], Any] | None = None, grace_s: float = 0.0) -> dict[str, int]:
        """Pause; in-flight groups get `timeout_s` to finish. Then `abort()` asks the workers to stop the rest
        between turns (their groups go back to the source) and they get `grace_s` more. Nothing is lost or
        duplicated: a group ends up ready, delivered or returned, once. Raises QuiesceTimeoutError (the
        scheduler stays paused) when some are still in flight after that. Returns the counts."""
        with self._cond:
            returned0 = self._core.totals["returned"]
            in_flight = len(self._core.pending)
        self._wait_settled(time.monotonic() + timeout_s)
        with self._cond:
            left = len(self._core.pending)
        if left and abort is not None:
            abort()
            self._wait_settled(time.monotonic() + grace_s)
        with self._cond:
            left = len(self._core.pending)
            rebuffered = self._core.totals["returned"] - returned0
        self._flush_returns()
        if left:
            raise QuiesceTimeoutError(
                f"{left} of {in_flight} in-flight group(s) still running {timeout_s} s after quiesce began "
                f"and {grace_s} s after they were asked to abort"
            )
        return {"in_flight": in_flight, "rebuffered": rebuffered, "finished": in_flight - rebuffered}

    def _wait_settled(self, deadline: float) -> None:
        with self._cond:
            self._core.paused = True
            self._cond.notify_all()
            while self._core.pending and self._error is None and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._error is not None:
                raise self._error

    def resume(self) -> None:
        with self._cond:
            self._raise_if_unusable()
            self._core.paused = False
            self._cond.notify_all()

    def state_dict(self) -> dict[str, Any]:
        """Ready-but-undelivered results and counters; only while paused with nothing in flight."""
        with self._cond:
            if not self._core.paused:
                raise SchedulerStateError("state_dict() needs a paused scheduler: call pause(drain=True) first")
            if self._core.pending:
                raise SchedulerStateError(
                    f"state_dict(): {len(self._core.pending)} group(s) still in flight; call pause(drain=True) first"
                )
            if self._core.demand or self._core.collecting:
                # A generate() in progress would deliver results the checkpoint also holds.
                raise SchedulerStateError("state_dict(): a batch is being collected; wait for generate()")
            return self._core.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._cond:
            if self._thread is not None:
                raise SchedulerStateError("load_state_dict() must be called before the first generate()")
            self._core.load_state_dict(state)

    def retire_worker(self, worker: int, reason: str = "retired by owner") -> None:
        """Take a worker out of service as if it had died (its finished results are still recovered)."""
        try:
            with self._cond:
                try:
                    self._retire_locked(worker, reason)
                except NoWorkerLeftError as exc:
                    self._error = exc  # generate()/pause() callers see it too
                    raise
                finally:
                    self._cond.notify_all()
        finally:
            self._flush_returns()

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return self._core.stats()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the loop, cancel in-flight calls, hand their groups back to the source, close the workers."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._cond:
            for token in list(self._core.pending):
                self._invoker.cancel(token)
                self._core.fail(token)
            self._core.return_undelivered()
        self._flush_returns()
        with self._cond:
            alive = [i for i, capacity in enumerate(self._core.capacities) if capacity]
        self._invoker.close(deadline, alive)

    def _raise_if_unusable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise SchedulerClosedError("the rollout scheduler is closed")
