"""One request of the session server (`agents.server.SessionServer` extends `RequestHandling`), after its key,
body and validation: the session's state (410 gone, 409 busy; a request without a session id is a one-off
session), the ids to feed and the context check (400: before any routing or lease), the affinity route
(rollout.SessionAffinityRouter: 410 tombstoned, 503 full), the engine call with its error mapping (410 gone or
dead engine, 503 gate sealed past its admission timeout or poisoned, 400 refused before generation, 502), and the
record (agents.trajectory). A request with `n` > 1 (a session's first and only one) is one engine request of n
rows, and records one segment per choice. The engine call is never cancelled: a client that goes away leaves it
to settle, and its segment is recorded with finish_reason "disconnected". Formats: agents/openai_shapes.py.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
import uuid
from collections import Counter
from typing import Any

from aiohttp import web

from agents import openai_shapes as shapes
from agents.chat import STOP, VOCAB_SIZE
from agents.protocol import ApiError, ChatRequest, Limits, bad_request, logit_bias, requested_tokens, session_of
from agents.sessions import SessionState, chat_feed, completion_feed, max_new_tokens, record_answer, record_choices
from agents.trajectory import Segment, Trajectory
from rollout.coalesce import CallCoalescer
from rollout.errors import (
    AdmissionTimeoutError,
    GatePoisonedError,
    NoEngineError,
    RejectedBeforeGeneration,
    RouterFullError,
    SessionGoneError,
)
from rollout.router import SessionAffinityRouter
from rollout.types import TurnCall


class RequestHandling:
    """The per-request half of `SessionServer`; its state is set by `SessionServer.__init__`."""

    engines: dict[str, Any]
    _turns: dict[str, CallCoalescer]  # per engine: the requests of one tick in one `generate_many` call
    block_size: int
    run: str
    limits: Limits
    router: SessionAffinityRouter
    sessions: dict[str, SessionState]
    counts: Counter[str]
    waiting: int
    version: int
    _ids: itertools.count[int]
    _background: set[asyncio.Task[Any]]

    def _new_state(self, sid: str, kind: str, one_off: bool = False) -> SessionState:
        if len(self.sessions) >= self.limits.max_records:
            raise ApiError(503, "the server holds its maximum of session records", type="server_busy")
        state = SessionState(Trajectory(session_id=sid, kind=kind), one_off=one_off)  # type: ignore[arg-type]
        self.sessions[sid] = state
        return state

    def _state(self, sid: str | None, api: str) -> SessionState:
        """The session's state, marked busy (410 when gone, 409 when a request is in flight)."""
        if sid is None:
            state = self._new_state(f"oneoff-{uuid.uuid4().hex}", "external", one_off=True)
        else:
            state = self.sessions.get(sid) or self._new_state(sid, "external")
        if state.record.state == "gone":
            raise _gone(state.record.session_id, state.record.gone_reason)
        if state.record.choices > 1:
            raise bad_request("session_id", f"session {sid!r} was answered with n choices: it takes no more requests")
        if state.busy:
            raise ApiError(409, f"session {sid!r} already has a request in flight", type="conflict", param="session_id")
        state.use(api)  # type: ignore[arg-type]
        state.busy = True
        return state

    async def _answer(self, request: web.Request, req: Any, api: str) -> web.StreamResponse:
        state = self._state(session_of(req.session_id, request.headers.get("X-Session-Id")), api)
        try:
            return await self._run(request, req, state)
        except ApiError as exc:
            if state.one_off or (not state.record.segments and exc.status != 410):
                self._forget(state.record.session_id)  # nothing of it is in an engine: the id is free again
            raise
        finally:
            state.busy = False

    async def _run(self, request: web.Request, req: Any, state: SessionState) -> web.StreamResponse:
        chat = isinstance(req, ChatRequest)
        if chat:
            feed, history = chat_feed(state, req.messages)
        else:
            feed, history = completion_feed(state, req.prompt), None
        sid, prompt = state.record.session_id, "" if chat else req.prompt
        if req.n > 1 and state.length:
            raise bad_request("n", f"n > 1 only on a session's first request; session {sid!r} has one already")
        requested = requested_tokens(req, self.block_size)
        n = max_new_tokens(state, feed, requested, self.block_size, "messages" if chat else "prompt")
        bias = logit_bias(req, VOCAB_SIZE)
        engine = self._route(sid)
        stream = await shapes.open_stream(request) if req.stream else None  # headers go out before generation
        self.counts["requests"] += 1
        stop = [STOP] if chat or req.stop else []
        try:
            # n choices: n rows of one engine request (the prompt computed once); the engine stops only one-row
            # requests, so each choice is cut after its first stop token here
            result = await self._generate(state, engine, [feed] * req.n, n, req, stop if req.n == 1 else [], bias)
        except ApiError as exc:
            if stream is None:
                raise
            self.counts[str(exc.status)] += 1  # the stream's 200 is sent: the error is its last event
            if state.one_off or (not state.record.segments and exc.status != 410):
                self._forget(sid)
            await shapes.stream_error(stream, exc.body())
            return stream
        gone = request.transport is None or request.transport.is_closing()
        segments = [_segment(result, k, feed, stop, engine, bias, gone) for k in range(req.n)]
        if req.n == 1:
            texts = [record_answer(state, segments[0], history, prompt)]
        else:
            texts = record_choices(state, segments)
        self.counts["tokens"] += sum(len(s.completion_ids) for s in segments)
        if state.one_off:
            self._forget(sid)
        body = shapes.answer(history is not None, self.run, sid, segments, texts, bool(req.logprobs))
        if stream is None:
            return web.json_response(body)
        try:
            await shapes.finish_stream(stream, body)
        except (ConnectionError, RuntimeError):
            segments[0].finish_reason = "disconnected"
        return stream

    def _route(self, sid: str) -> str:
        try:
            engine = self.router.acquire(sid)
        except SessionGoneError as exc:
            raise _gone(sid, str(exc)) from None
        except (RouterFullError, NoEngineError) as exc:
            raise ApiError(503, str(exc), type="server_busy") from None
        self.sessions[sid].record.engine = engine
        return engine

    async def _generate(
        self,
        state: SessionState,
        engine: str,
        rows: list[list[int]],
        n: int,
        req: Any,
        stop: list[int],
        bias: tuple[tuple[int, float], ...] = (),
    ) -> dict[str, Any]:
        """The engine call, shielded: if this handler is cancelled the call still settles (a cancelled lease
        would be an unknown outcome and poison the gate); errors map to 410/503/400."""
        sid = state.record.session_id
        seed = req.seed if req.seed is not None else next(self._ids) + int(time.time() * 1000) % 2**31
        rid = f"{sid}/{len(state.record.segments)}-{next(self._ids)}"
        last = state.one_off or len(rows) > 1  # no end_session follows: the engine frees the rows with the answer
        turn = TurnCall(sid, rows, n, seed, rid, req.temperature == 0, state.length > 0, last, tuple(stop), bias)
        task = asyncio.ensure_future(self._turns[engine].submit(turn))  # one engine call per tick (coalesce.py)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        self.router.request_started(engine)
        self.waiting += 1
        reported = None
        try:
            result: dict[str, Any] = await asyncio.shield(task)
            reported = int(result.get("inflight", 0))
            self.version = max(self.version, int(result["version"]))
            return result
        except SessionGoneError as exc:
            self._tombstone([sid], str(exc))
            self.router.remove_session(sid, engine, exc.reason)
            raise _gone(sid, str(exc)) from None
        except (AdmissionTimeoutError, GatePoisonedError) as exc:
            raise ApiError(503, f"engine {engine!r}: {exc}", type="server_busy") from None
        except RejectedBeforeGeneration as exc:
            raise ApiError(400, str(exc), type="invalid_request_error") from None
        except Exception as exc:
            if not _engine_died(exc):
                raise ApiError(502, f"engine {engine!r} failed: {exc!r}", type="engine_error") from None
            gone = self.router.remove_engine(engine, reason=f"died ({type(exc).__name__})")
            self._tombstone([sid, *gone], f"engine {engine!r} died")
            raise _gone(sid, f"engine {engine!r} died; the session is not replayed elsewhere") from None
        finally:
            self.waiting -= 1
            self.router.request_finished(engine, reported=reported)

    def _tombstone(self, sids: list[str], reason: str) -> None:
        for sid in sids:
            state = self.sessions.get(sid)
            if state is not None:
                state.record.state, state.record.gone_reason = "gone", reason

    def _forget(self, sid: str) -> None:
        self.sessions.pop(sid, None)
        self.router.release(sid)


def _segment(
    result: dict[str, Any],
    k: int,
    feed: list[int],
    stop: list[int],
    engine: str,
    bias: tuple[tuple[int, float], ...],
    disconnected: bool,
) -> Segment:
    """Choice k of an engine answer as a segment; a choice of several is cut after its first stop token."""
    tokens, logprobs, finish = result["tokens"][k], result["logprobs"][k], result["finish_reasons"][k]
    cut = next((i for i, t in enumerate(tokens) if t in stop), None) if len(result["tokens"]) > 1 else None
    if cut is not None:
        tokens, logprobs, finish = tokens[: cut + 1], logprobs[: cut + 1], "stop"
    return Segment(
        request_id=result["request_id"],
        prompt_ids=feed,
        completion_ids=tokens,
        logprobs=logprobs,
        versions=[result["version"]] * len(tokens),
        finish_reason="disconnected" if disconnected else finish,
        engine=engine,
        logit_bias=list(bias),
        choice=k,
    )


def _gone(sid: str, reason: str) -> ApiError:
    return ApiError(410, f"session {sid!r} is gone: {reason}", type="session_gone", param="session_id")


def _engine_died(exc: BaseException) -> bool:
    """A Ray actor error (the engine process is gone); never imports Ray when the caller does not use it."""
    ray_exceptions = sys.modules.get("ray.exceptions")
    return ray_exceptions is not None and isinstance(exc, ray_exceptions.RayActorError)
