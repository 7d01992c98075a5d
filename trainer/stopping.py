"""Stop handling of a training run: taking a stop request at any moment, and ending the run cleanly.

A stop is asked for by SIGTERM (`ray job stop`) or by the platform answering 409 ("the run is finished").
`StopControl.request` is safe from a signal handler; the loop notices the request at its next safe point
(`StopControl.check` raises `StopRequested`) and `finish_stopped` ends the run: every dispatched but untrained
group goes back to the sampler, a stop checkpoint is taken, and the run reports `cancelled`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rollout.scheduler import RolloutScheduler

if TYPE_CHECKING:
    from trainer.loop import RunResult, TrainingRun


class StopRequested(Exception):
    """The job was asked to stop (SIGTERM from `ray job stop`, or the platform answered 409)."""


class StopControl:
    """One run's stop request: a flag the loop polls, and the closing of the scheduler that wakes the driver."""

    def __init__(
        self, emit: Callable[[str, dict[str, Any]], None], scheduler: Callable[[], RolloutScheduler | None]
    ) -> None:
        self.event = threading.Event()
        self._emit = emit
        self._scheduler = scheduler  # None until the run has started its runtime
        self._closer: threading.Thread | None = None

    def is_set(self) -> bool:
        return self.event.is_set()

    def request(self, reason: str) -> None:
        """Safe from a signal handler: stop at the next safe point; dispatched, untrained groups go back."""
        if self.event.is_set():
            return
        self.event.set()
        # Work happens on a thread: the handler may have interrupted the main thread inside emit().
        self._closer = threading.Thread(target=self._close, args=(reason,), daemon=True)
        self._closer.start()

    def check(self, platform_says_finished: bool) -> None:
        """The loop's safe point: raise StopRequested when a stop was asked for (or the platform said 409)."""
        if platform_says_finished:
            self.request("the platform says the run is finished (HTTP 409)")
        if self.event.is_set():
            raise StopRequested()

    def wait_closed(self, timeout_s: float) -> None:
        if self._closer is not None:
            self._closer.join(timeout=timeout_s)

    def _close(self, reason: str) -> None:
        self._emit("log", {"level": "warning", "message": f"stopping: {reason}"})
        scheduler = self._scheduler()
        if scheduler is not None:
            # Closing the scheduler wakes a driver blocked in generate() and returns every group that was
            # dispatched but not trained on to the sampler, so the stop checkpoint loses none of them.
            scheduler.close(timeout_s=10)


def finish_stopped(run: TrainingRun) -> RunResult:
    """End a run that was asked to stop: give back untrained groups, checkpoint, report `cancelled`."""
    run.emit("status", {"status": "stopping", "version": run.version})
    run.stop_control.wait_closed(timeout_s=15)
    if run.started:
        run.rt.scheduler.close(timeout_s=10)  # idempotent: every untrained group is back in the sampler
    if run.checkpoint_dir and run.version > 0:
        # The scheduler is closed: every untrained group is back in the sampler, so its state suffices.
        run.checkpoint("stop", quiesce=False)
    run.emit("status", {"status": "cancelled", "version": run.version, "metrics": run.metrics})
    return run.result("cancelled")
