"""The rollout scheduler's background thread (`rollout.scheduler.RolloutScheduler` extends `SchedulerLoop`):
dispatch prompt groups from the source to free worker slots, wait for calls to finish, run the filters on their
results outside the lock and settle them in the core, retire a worker that died (recovering the results it had
finished), and hand groups that were not delivered back to the source.

The rules (capacities, prefetch bound, the ledger) are SchedulerCore's (rollout/scheduler_core.py); this thread
only drives it, under the condition the trainer-facing calls share.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from rollout.errors import NoWorkerLeftError, SchedulerStateError
from rollout.filters import KEEP, GroupFilter, verdict_of
from rollout.invoke_workers import LOST, OK, WorkerInvoker
from rollout.scheduler_core import SchedulerCore

if TYPE_CHECKING:
    from rollout.scheduler import GroupSource

log = logging.getLogger("rollout.scheduler")  # the scheduler's log, whichever of its modules writes


class SchedulerLoop:
    """The background half of `RolloutScheduler`; its state is set by `RolloutScheduler.__init__`."""

    _core: SchedulerCore
    _invoker: WorkerInvoker
    _source: GroupSource
    _filters: list[GroupFilter]
    _poll: float
    _cond: threading.Condition
    _batch_id: Any
    _closed: bool
    _error: BaseException | None
    _starved: bool

    def _run(self) -> None:
        try:
            while True:
                # Returns first: a group handed back must be visible before the source is judged exhausted.
                self._flush_returns()
                with self._cond:
                    if self._closed:
                        return
                    slots = self._core.dispatch_slots()
                    batch_id = self._batch_id
                if slots:
                    self._dispatch(slots, batch_id)
                with self._cond:
                    tokens = list(self._core.pending)
                    if not tokens:
                        self._check_exhausted(slots)
                        self._cond.wait(timeout=0.5)  # generate/resume/close notify; no busy polling when idle
                        continue
                done = self._invoker.wait(tokens, self._poll)
                if done:
                    self._settle(done)
        except BaseException as exc:  # noqa: BLE001 - surfaced to generate()/pause() callers
            with self._cond:
                self._error = exc
                self._cond.notify_all()
        finally:
            self._flush_returns()

    def _dispatch(self, slots: list[int], batch_id: Any) -> None:
        groups = self._source.get_groups(len(slots))
        if len(groups) > len(slots):
            raise ValueError(f"source returned {len(groups)} groups for a request of {len(slots)}")
        calls = [(self._invoker.submit(worker, group, batch_id), worker, group) for worker, group in zip(slots, groups)]
        with self._cond:
            for token, worker, group in calls:
                self._core.register(token, worker, group)
            self._starved = len(groups) < len(slots)

    def _check_exhausted(self, slots: list[int]) -> None:
        # Called under the lock with nothing pending: if the source gave nothing, nothing will ever arrive.
        if slots and self._starved and self._core.demand and not self._core.ready:
            raise SchedulerStateError(f"data source exhausted with {self._core.demand} group(s) still needed")

    def _settle(self, done: list[Any]) -> None:
        with self._cond:
            owners = [(token, self._core.pending[token][0]) for token in done if token in self._core.pending]
        outcomes = []
        for token, worker in owners:
            kind, value = self._invoker.outcome(token)
            # Filters run outside the lock: they may be slow, and trainer calls must not wait on them.
            verdict = verdict_of(self._filters, value) if kind == OK and not value.aborted else KEEP
            outcomes.append((token, worker, kind, value, verdict))
        with self._cond:
            try:
                for token, worker, kind, value, verdict in outcomes:
                    if token not in self._core.pending:
                        continue  # recovered while its worker was retired
                    if kind == OK:
                        self._core.complete(token, value, verdict)
                    elif kind == LOST:
                        self._core.fail(token)
                        self._retire_locked(worker, value)
                    else:
                        self._core.fail(token)
                        raise RuntimeError(f"rollout worker {worker} failed a group: {value!r}") from value
            finally:
                self._cond.notify_all()

    def _retire_locked(self, worker: int, reason: Any) -> None:
        if not self._core.capacities[worker]:
            return
        log.warning("retiring rollout worker %d: %s", worker, reason)
        try:
            tokens = self._core.retire(worker)
        except NoWorkerLeftError:
            self._invoker.kill(worker)
            raise
        for token in tokens:
            # A result the worker finished before dying is still retrievable: deliver it.
            if self._invoker.finished(token):
                kind, value = self._invoker.outcome(token)
                if kind == OK:
                    verdict = KEEP if value.aborted else verdict_of(self._filters, value)
                    self._core.complete(token, value, verdict)
                    self._core.totals["recovered"] += 1
                    continue
            self._invoker.cancel(token)
            self._core.fail(token)
        self._invoker.kill(worker)

    def _flush_returns(self) -> None:
        with self._cond:
            returns = self._core.take_returns()
        if returns:
            self._source.return_groups(returns)
