"""The running batch of an engine (`trainer.engine.Engine` extends `BatchRunner`): placing a new session's
requests on KV rows, running forward steps over every admitted request (on the event loop itself for a cheap lone
request, else on the engine's step thread), retiring finished requests with their answers, failing the requests
of a failed step, and aborting requests (their sessions tombstoned, their rows freed once they have left). Also
the fault injection that slows or fails steps on purpose (`throttle`, `inject_step_failures`).

Sessions, rows and the batch change only on the event loop between steps; a row a running step uses is never
freed under it. docs/trainer.md, "Engine" ("Asynchronous", "Join and leave").
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import time
from typing import TYPE_CHECKING

from rollout.errors import SessionGoneError
from trainer.batching import Batcher, SessionTable
from trainer.config import TrainConfig

if TYPE_CHECKING:
    from trainer.engine_step import GenRequest
    from trainer.kvpool import KVPool
    from trainer.policy import TinyTransformer

# A lone request's step predicted to take less CPU than this runs on the event loop, not the step thread.
INLINE_STEP_S = 0.005


class BatchRunner:
    """The batch-running half of `Engine`; its state is set by `Engine.__init__`."""

    cfg: TrainConfig
    engine_id: str
    model: TinyTransformer
    pool: KVPool
    table: SessionTable
    batcher: Batcher[GenRequest]
    steps: int
    rows_stepped: int
    _executor: cf.ThreadPoolExecutor
    _stepper: asyncio.Task[None] | None
    _to_clear: list[int]
    _step_delay_s: float
    _failing_steps: int
    _lone_cost_s: float
    _holding: int  # > 0 while generate_many admits its requests: no step starts until they all joined
    if TYPE_CHECKING:  # `ops` is the module trainer.engine_step (GenRequest, run_step and the rest of one step)
        from trainer import engine_step as ops

    def _kick(self) -> None:
        if self._holding:
            return  # generate_many kicks once its requests are all in
        if self._stepper is None or self._stepper.done():
            if not self._run_inline():  # a lone cheap request is often answered right here, no task, no hop
                self._stepper = asyncio.get_running_loop().create_task(self._step_loop())

    async def _step_loop(self) -> None:
        """Admit, step, retire, until nothing is left to run; every step advances every active request."""
        loop = asyncio.get_running_loop()
        while not self._run_inline():
            batch = list(self.batcher.active)
            if self._inline(batch):  # the inline budget ran out mid-request: let the loop admit, cancel, answer
                await asyncio.sleep(0)
                continue
            fresh, self._to_clear = self._to_clear, []
            try:
                await loop.run_in_executor(self._executor, self._steps, batch, fresh)
            except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the engine
                self._fail(batch, exc)

    def _run_inline(self) -> bool:
        """Retire, admit, and run on the loop the steps that fit the inline budget (`_inline`); True when nothing
        is left to run (waiting requests, if any, need rows a finishing session frees: end_session kicks again)."""
        while True:
            self._retire()
            self.batcher.admit(self._place)
            batch = list(self.batcher.active)
            if not batch:
                return True
            if not self._inline(batch):
                return False
            fresh, self._to_clear = self._to_clear, []
            try:
                if not self._steps(batch, fresh, inline=True):
                    return False
            except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the engine
                self._fail(batch, exc)

    def _place(self, request: GenRequest) -> bool:
        """Rows for a request of a new session (evicting idle sessions if needed); False: wait for rows."""
        if request.future.done():
            return False  # aborted or cancelled while waiting: retired, never run
        if request.session is not None:
            return True
        sess = self.table.place(request.session_id, len(request.feed))
        if sess is None:
            return False
        self._to_clear += sess.rows  # zeroed on the step thread before the step that first uses them
        sess.busy = True
        request.session = sess
        return True

    def _inline(self, batch: list[GenRequest], spent_s: float = 0.0) -> bool:
        """Run the next step on the event loop itself: a lone request (nobody waiting to join) whose step is
        predicted to end within INLINE_STEP_S of CPU (counting `spent_s` already spent inline). The hop to the step
        thread and back (two thread wake-ups) costs a lone session more than such steps; longer ones, or a batch,
        go to the step thread."""
        if len(batch) != 1 or self.batcher.waiting or self._step_delay_s:
            return False
        return spent_s + self._lone_cost_s * self.ops.step_chunks(batch[0]) < INLINE_STEP_S

    def _steps(self, batch: list[GenRequest], fresh_rows: list[int], inline: bool = False) -> bool:
        """Steps over `batch` until a request finishes or stops, or another waits to join (then the event loop
        answers, retires and admits): one hop per event, not per token. On the step thread; or `inline`, on the
        loop, while the steps fit the inline budget. True: it stopped at such an event (not at the budget)."""
        if fresh_rows:
            self.pool.clear(fresh_rows)
        spent = 0.0
        while True:
            if self._step_delay_s:
                time.sleep(self._step_delay_s)  # throttle(): a slow device, on purpose
            if self._failing_steps:
                self._failing_steps -= 1
                raise RuntimeError("injected step failure")
            lone, began = len(batch) == 1, time.thread_time()
            chunks = self.ops.step_chunks(batch[0]) if lone else 0
            self.ops.run_step(self.model, self.pool, batch, self.cfg.temperature)
            self.rows_stepped += sum(len(r.feed) for r in batch)
            if lone:  # what a lone step costs per 16-row chunk: _inline predicts from it
                took = time.thread_time() - began
                self._lone_cost_s, spent = took / chunks, spent + took
            self.steps += 1
            # Racy reads of loop-owned state are fine here: a change seen one step late costs one step.
            if self.batcher.waiting or any(r.done or r.future.done() for r in batch):
                return True
            if inline and not self._inline(batch, spent):
                return False

    def _fail(self, batch: list[GenRequest], exc: Exception) -> None:
        """A failed step fails every request in it; their leases settle "error" (fail closed: the gate poisons)."""
        for request in batch:
            if not request.future.done():
                request.future.set_exception(RuntimeError(f"engine {self.engine_id!r} step failed: {exc!r}"))
                self._abort(request, f"its step failed ({type(exc).__name__})")

    def _retire(self) -> None:
        """Finished requests leave with their answer; cancelled or aborted ones leave (their sessions were
        tombstoned when they stopped) and their rows are freed now, when no running step uses them."""
        for request in self.batcher.retire(lambda r: r.done or r.future.done()):
            sess = request.session
            assert sess is not None
            if request.future.done():  # aborted or cancelled: already tombstoned, its rows are freed now
                self.table.finished(request.session_id)
                continue
            sess.length, sess.version = request.length, request.version
            sess.pending = [int(t) for t in request.tokens[-1].view(-1).tolist()]
            self.table.finished(request.session_id)
            if request.last:  # the episode's final turn: no end_session follows, its rows are free now
                self.table.end(request.session_id)
            request.future.set_result(self.ops.request_result(request, self.engine_id, self.batcher.inflight))
        for request in self.batcher.drop_waiting(lambda r: r.future.done()):
            if request.session is not None:
                self.table.finished(request.session_id)

    def _abort_all(self, why: str) -> None:
        for request in self.batcher.all():
            if not request.future.done():
                reason = f"request {request.request_id!r} {why}"
                request.future.set_exception(SessionGoneError(request.session_id, self.engine_id, reason))
                self._abort(request, reason)

    def _abort(self, request: GenRequest, reason: str) -> None:
        """The request stops (it leaves the batch at the next step boundary) and its session is gone at once:
        its rows may hold part of a turn. The rows are freed when the request has left."""
        request.abort_reason = reason
        self.table.tombstone(request.session_id, reason)
        if request.session is None:  # never placed: it holds no rows
            self.batcher.drop_waiting(lambda r: r is request)

    def throttle(self, step_delay_s: float) -> None:
        """Fault injection for tests and drills: every forward step takes `step_delay_s` longer (0: off)."""
        if not 0 <= step_delay_s <= 60:
            raise ValueError("step_delay_s must be within [0, 60]")
        self._step_delay_s = step_delay_s

    def inject_step_failures(self, steps: int) -> None:
        """Fault injection for tests and drills: the next `steps` forward steps fail (an unknown outcome for
        every request in them: their leases settle "error" and the gate poisons until a reset)."""
        if not 0 <= steps <= 1000:
            raise ValueError("steps must be within [0, 1000]")
        self._failing_steps = steps
