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

Here: building the engine, turning a `generate` call into a request, ending sessions, the publication protocol
and the snapshot. Running the batch (placing, stepping, retiring, aborting) is `trainer.engine_runner.BatchRunner`,
which Engine extends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rollout.errors import DrainTimeoutError, RejectedBeforeGeneration, SessionGoneError
from rollout.gate import RequestGate, SettlementReceipt
from trainer.batching import Batcher, SessionTable
from trainer.config import TrainConfig
from trainer.engine_runner import BatchRunner
from trainer.problems import policy_shape

if TYPE_CHECKING:
    import torch

    from rollout.types import TurnCall
    from trainer.engine_step import GenRequest


class Engine(BatchRunner):
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
        self._holding = 0
        self.tokens_fed = 0  # tokens run through the model (prompt + new turn tokens), shows cache reuse
        self.requests = self.rejections = self.gone = self.steps = 0
        self.rows_stepped = 0  # rows advanced over all forward steps: rows_stepped / steps is the batching
        self.calls = 0  # generate_many calls (a worker's coalesced turns): requests / calls is the batching

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
        logit_bias: list[tuple[int, float]] | None = None,
    ) -> dict[str, Any]:
        """Feed this turn's new tokens after the session's cache and sample up to `n` tokens per row.

        `continues`: a later turn of a session this engine should hold; without its cache the request gets
        SessionGoneError, never an answer computed without its context. `last`: the episode's final turn: once
        it is answered the session ends here (its rows are freed), so the caller sends no `end_session`. `stop`: token
        ids that finish a one-row request when sampled (the stop token is its last token and stays pending, like
        any last token); a multi-row request with `stop` is refused (RejectedBeforeGeneration). The answer's
        `finish_reasons` says per row "stop" or "length". `logit_bias`: (token id, bias) pairs added to every row's
        logits / temperature before sampling; the answer's log-probs are under that biased distribution."""
        async with self.gate.lease(session_id, request_id=request_id, timeout=self.cfg.publish_deadline_s * 4) as lease:
            request = self._request(
                lease, session_id, new_tokens, n, seed, greedy, continues, frozenset(stop or ()), logit_bias or ()
            )
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

    async def generate_many(self, calls: list[TurnCall]) -> list[dict[str, Any] | BaseException]:
        """The turns a caller (a rollout worker, a session server) coalesced in one tick of its loop
        (rollout/coalesce.py): each is its own request with its own lease, exactly as `generate`; one outcome
        per call, in order, a failed request's outcome being its exception. They are all admitted before the
        first step, so they run as one batch rather than one by one on the event loop (`_run_inline` takes a
        lone request)."""
        self.calls += 1
        tasks = [
            asyncio.ensure_future(
                self.generate(
                    c.session_id,
                    c.new_tokens,
                    c.n,
                    c.seed,
                    c.request_id,
                    c.greedy,
                    c.continues,
                    c.last,
                    list(c.stop),
                    list(c.logit_bias),
                )
            )
            for c in calls
        ]
        try:
            self._holding += 1
            try:
                await asyncio.sleep(0)  # each task runs up to its request's admission (or its wait at a closed gate)
            finally:
                self._holding -= 1
                self._kick()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:  # this call was cancelled: so is each request (their leases poison)
            for task in tasks:
                task.cancel()
            raise
        return [
            RuntimeError(f"request {c.request_id!r} was cancelled") if isinstance(o, asyncio.CancelledError) else o
            for c, o in zip(calls, outcomes)
        ]

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
        logit_bias: Sequence[tuple[int, float]] = (),
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
        vocab = self.model.tok.num_embeddings
        reason = self.ops.invalid_request(feed, n, cached, self.model.block_size, vocab, stop, logit_bias)
        if reason:
            self.rejections += 1
            raise RejectedBeforeGeneration(f"request {lease.request_id!r}: {reason}")
        generator = self.ops.request_generator(seed, greedy)
        request: GenRequest = self.ops.GenRequest(
            session_id, lease.request_id, lease.version, feed, n, greedy, generator, stop=stop
        )
        request.bias = self.ops.bias_vector(logit_bias, vocab)
        request.future = asyncio.get_running_loop().create_future()
        if sess is not None:
            sess.busy = True
            request.session, request.length = sess, sess.length
        self.requests += 1
        self.tokens_fed += sum(len(r) for r in feed) + len(feed) * (n - 1)
        return request

    def end_session(self, session_id: str) -> None:
        self.end_sessions([session_id])

    def end_sessions(self, session_ids: list[str]) -> None:
        """Free the sessions' caches (a session server ends a group's sessions in one call per engine)."""
        for session_id in session_ids:
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
            rows_stepped=self.rows_stepped,
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
