"""A generation engine: a policy copy at some weight version, a request gate, and a continuously batched
forward loop over per-session KV caches.

Each request is admitted by the engine's `RequestGate` and holds its lease until its last token: a
publication's seal stops admission, drain waits for the requests in flight, and at the drain deadline they are
aborted (the gate poisons itself: their outcome is unknown). Admitted requests join a running batch
(`trainer.batching`); one forward step advances every request in it by one token, each on its own session's
rows of the KV pool (`trainer.kvpool`). The step runs on a thread of its own, so the event loop keeps admitting,
cancelling and answering while the model computes. A session's later turns only feed their new tokens: the
conversation so far lives in its rows, which is why routing is sticky. Plain class; `trainer.topology`
deploys it as an async Ray actor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import time
from typing import TYPE_CHECKING, Any

from rollout.errors import DrainTimeoutError, RejectedBeforeGeneration, SessionGoneError
from rollout.gate import RequestGate, SettlementReceipt
from trainer.batching import Batcher, SessionTable
from trainer.config import TrainConfig
from trainer.problems import policy_shape

if TYPE_CHECKING:
    import torch

    from trainer.engine_step import GenRequest

# A lone request's step predicted to take less CPU than this runs on the event loop, not the step thread.
INLINE_STEP_S = 0.005


class Engine:
    def __init__(
        self,
        cfg: TrainConfig,
        engine_id: str,
        *,
        initially_open: bool = True,
        max_sessions: int | None = None,
        max_batch: int | None = None,
        threads: int = 1,
        gpus: float = 0.0,
    ) -> None:
        # torch and the model code load here, not when this module is imported: Ray imports an actor's class
        # module to unpickle a handle to it, and a rollout worker holding engine handles should not pay torch's
        # ~1.4 s and ~250 MiB for nothing (docs/trainer.md, "What a process imports").
        import torch

        from trainer import engine_step
        from trainer.engine_sizing import sizing_on_device
        from trainer.kvpool import KVPool
        from trainer.learner import pick_device
        from trainer.policy import build_policy

        torch.set_num_threads(threads)  # the whole CPUs of its bundle (trainer/resources.py), at least one
        self.ops = engine_step  # GenRequest, run_step and the rest of one forward step
        self.cfg, self.engine_id = cfg, engine_id
        vocab_size, block_size = policy_shape(cfg)
        self.device = pick_device(cfg.device, gpus)
        torch.manual_seed(cfg.seed)  # same initial weights as the learner's version 0
        self.model = build_policy(cfg, vocab_size, block_size).to(self.device).eval()
        self.sizing = sizing_on_device(cfg, block_size, self.device, gpus)
        self.max_batch = max_batch or self.sizing.max_batch
        self.max_sessions = max_sessions or self.sizing.max_sessions
        rows = self.max_sessions * cfg.group_size
        self.table = SessionTable(engine_id, rows, self.max_sessions)
        self.pool = KVPool(self.model, rows, self.device)
        self.batcher: Batcher[GenRequest] = Batcher(self.max_batch)
        self.gate = RequestGate(name=engine_id, version=0, initially_open=initially_open)
        self._executor = cf.ThreadPoolExecutor(1, thread_name_prefix=f"{engine_id}-step")
        self._stepper: asyncio.Task[None] | None = None
        self._staged: tuple[int, dict[str, torch.Tensor]] | None = None  # weights sent ahead (stage_version)
        self._sessions_in_flight: set[str] = set()
        self._step_delay_s = 0.0
        self._failing_steps = 0  # inject_step_failures(): the next steps raise (their leases poison the gate)
        self._lone_cost_s = float("inf")  # CPU seconds per 16-row chunk of the last lone step (unknown yet)
        self._to_clear: list[int] = []
        self.tokens_fed = 0  # tokens run through the model (prompt + new turn tokens), shows cache reuse
        self.requests = self.rejections = self.gone = self.steps = 0

    @property
    def sessions(self) -> dict[str, Any]:
        return self.table.sessions

    # --- generation -------------------------------------------------------------------------------------
    async def generate(
        self,
        session_id: str,
        new_tokens: list[list[int]],
        n: int,
        seed: int,
        request_id: str,
        greedy: bool = False,
        continues: bool = False,
        last: bool = False,
        stop: list[int] | None = None,
    ) -> dict[str, Any]:
        """Feed this turn's new tokens after the session's cache and sample up to `n` tokens per row.

        `continues`: a later turn of a session this engine should hold; without its cache the request gets
        SessionGoneError, never an answer computed without its context. `last`: the episode's final turn: once
        it is answered the session ends here (its rows are freed), so the caller sends no `end_session`. `stop`: token
        ids that finish a one-row request when sampled (the stop token is its last token and stays pending, like
        any last token); a multi-row request with `stop` is refused (RejectedBeforeGeneration). The answer's
        `finish_reasons` says per row "stop" or "length"."""
        async with self.gate.lease(session_id, request_id=request_id, timeout=self.cfg.publish_deadline_s * 4) as lease:
            request = self._request(lease, session_id, new_tokens, n, seed, greedy, continues, frozenset(stop or ()))
            request.last = last
            self._sessions_in_flight.add(session_id)
            self.batcher.submit(request)
            self._kick()
            try:
                return await request.future
            except asyncio.CancelledError:  # the lease settles "cancelled" (unknown outcome: poisons)
                self._abort(request, "its request was cancelled mid-turn")
                raise
            finally:
                self._sessions_in_flight.discard(session_id)

    def _request(
        self,
        lease: Any,
        session_id: str,
        rows: list[list[int]],
        n: int,
        seed: int,
        greedy: bool,
        continues: bool,
        stop: frozenset[int],
    ) -> GenRequest:
        try:
            if session_id in self._sessions_in_flight:
                raise RejectedBeforeGeneration(f"session {session_id!r} already has a request in flight")
            sess = self.table.check(session_id, continues=continues, group=len(rows))
        except SessionGoneError as exc:
            self.gone += 1
            lease.settle(SettlementReceipt.rejected(lease, str(exc)))  # nothing ran: safe, not a poison
            raise
        except RejectedBeforeGeneration:
            self.rejections += 1
            raise
        pending = sess.pending if sess is not None and sess.pending is not None else None
        feed = [([pending[i]] if pending else []) + list(row) for i, row in enumerate(rows)]
        cached = sess.length if sess is not None else 0
        reason = self.ops.invalid_request(feed, n, cached, self.model.block_size, self.model.tok.num_embeddings, stop)
        if reason:
            self.rejections += 1
            raise RejectedBeforeGeneration(f"request {lease.request_id!r}: {reason}")
        generator = self.ops.request_generator(seed, greedy)
        request = self.ops.GenRequest(
            session_id, lease.request_id, lease.version, feed, n, greedy, generator, stop=stop
        )
        request.future = asyncio.get_running_loop().create_future()
        if sess is not None:
            sess.busy = True
            request.session, request.length = sess, sess.length
        self.requests += 1
        self.tokens_fed += sum(len(r) for r in feed) + len(feed) * (n - 1)
        return request

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

    def _kick(self) -> None:
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

    def _fail(self, batch: list[GenRequest], exc: Exception) -> None:
        """A failed step fails every request in it; their leases settle "error" (fail closed: the gate poisons)."""
        for request in batch:
            if not request.future.done():
                request.future.set_exception(RuntimeError(f"engine {self.engine_id!r} step failed: {exc!r}"))
                self._abort(request, f"its step failed ({type(exc).__name__})")

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
            if lone:  # what a lone step costs per 16-row chunk: _inline predicts from it
                took = time.thread_time() - began
                self._lone_cost_s, spent = took / chunks, spent + took
            self.steps += 1
            # Racy reads of loop-owned state are fine here: a change seen one step late costs one step.
            if self.batcher.waiting or any(r.done or r.future.done() for r in batch):
                return True
            if inline and not self._inline(batch, spent):
                return False

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

    def end_session(self, session_id: str) -> None:
        self.table.end(session_id)
        if self.batcher.waiting:
            self._kick()  # freed rows may let a waiting request in

    # --- publication protocol (rollout.PublicationController) --------------------------------------------
    def seal(self) -> None:
        self.gate.seal()

    async def drain(self, timeout_s: float) -> int:
        """Wait for the requests in flight; at the deadline the gate poisons itself and they are aborted.
        Returns how many leases the drain waited for (RequestGate.drain)."""
        try:
            return await self.gate.drain(timeout_s=timeout_s)
        except DrainTimeoutError:
            self._abort_all("was aborted at the drain deadline")
            raise

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

    async def stage_version(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Keep `version`'s weights for its install: sent while the gate is open, so the transfer is not in the
        closed window. The gate is not touched; the next install takes them (or drops them)."""
        self._staged = (version, weights)

    async def install_version(
        self, version: int, weights: dict[str, torch.Tensor] | None = None, staged: bool = False
    ) -> None:
        """Install `version` (its `weights`, or with `staged` the ones stage_version kept for it)."""
        kept, self._staged = self._staged, None
        if staged:
            if kept is None or kept[0] != version:
                raise ValueError(f"engine {self.engine_id}: v{version} was not staged")  # the gate is untouched
            weights = kept[1]
        self.gate.install_version(version)  # refuses unless sealed and drained (so nothing is in the batch)
        if weights is not None:
            if self._stepper is not None and not self._stepper.done():
                await asyncio.wait({self._stepper})  # never change weights under a running step
            self.model.load_state_dict(weights)

    def reopen(self) -> int:
        """Open the gate; returns how many requests waited at it and are admitted now (RequestGate.reopen)."""
        return self.gate.reopen()

    def reset(self, reason: str = "reset by owner") -> str | None:
        """Clear a poisoned gate (staff resolved the unknown outcomes: trainer/controls.py); it stays closed:
        drain, install or reopen next. Returns the poison reason."""
        return self.gate.reset(reason)

    def snapshot(self) -> dict[str, Any]:
        snap = self.gate.snapshot()
        snap.update(
            sessions=len(self.table.sessions),
            tokens_fed=self.tokens_fed,
            requests=self.requests,
            inflight=self.batcher.inflight,
            max_batch=self.max_batch,
            batch=len(self.batcher.active),
            steps=self.steps,
            evictions=self.table.evictions,
            rejections=self.rejections,
            sessions_gone=self.gone,
            max_sessions=self.max_sessions,
            kv_rows=self.table.rows,
            kv_rows_used=self.table.rows_used,
            device=str(self.device),
        )
        return snap

    def load(self) -> int:
        """Requests in flight (admitted, not answered): what routers balance new sessions on."""
        return self.batcher.inflight

    def ping(self) -> str:
        return self.engine_id
