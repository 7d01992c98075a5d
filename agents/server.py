"""SessionServer: the run's OpenAI-compatible HTTP entrypoint in front of its engines (an aiohttp app; deployed
as an async Ray actor by `deploy_server`, one actor per entrypoint).

Per request, in this order: bearer key (401), body size (413), validation (400), the session's state (410 gone,
409 busy), the ids to feed and the context check (400: before any routing or lease), the affinity route
(rollout.SessionAffinityRouter: 410 tombstoned, 503 full), the engine's gate lease and generation inside
`Engine.generate` (503 when the gate stays sealed past its admission timeout or is poisoned), then settlement
and the record (agents.trajectory). The engine call is never cancelled: a client that goes away leaves it to
settle, and its segment is recorded with finish_reason "disconnected". Formats: agents/openai_shapes.py.

Here: the actor methods (start, stop, sessions, engine membership, stats) and the HTTP side (routes, the key
check and error middleware, the body). One request from its session's state on is
`agents.server_request.RequestHandling`, which SessionServer extends.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
from collections import Counter
from typing import Any

from aiohttp import web

from agents import openai_shapes as shapes
from agents.protocol import ApiError, ChatRequest, CompletionRequest, Limits, parse_body, parse_json, session_of
from agents.server_request import RequestHandling
from agents.sessions import SessionState
from agents.trajectory import Trajectory
from rollout.coalesce import CallCoalescer
from rollout.invoke import call
from rollout.router import SessionAffinityRouter


class SessionServer(RequestHandling):
    def __init__(
        self, engines: dict[str, Any], *, block_size: int, key: str, run: str = "run", limits: Limits | None = None
    ) -> None:
        if not engines or not key:
            raise ValueError("a session server needs at least one engine and a non-empty key")
        self.engines, self.block_size, self.run = dict(engines), block_size, run
        self._turns = {e: CallCoalescer(h, "generate_many") for e, h in self.engines.items()}
        self.limits = limits or Limits()
        self._key = key.encode()
        self.router = SessionAffinityRouter(self.engines, max_sessions=self.limits.max_sessions)
        self.sessions: dict[str, SessionState] = {}
        self.counts: Counter[str] = Counter()
        self.waiting = 0  # requests sent to an engine and not answered (a sealed gate's waiters included)
        self.version = 0  # the newest lease version seen
        self._ids = itertools.count()
        self._runner: web.AppRunner | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # --- actor methods ------------------------------------------------------------------------------------
    async def start(self, host: str | None = "127.0.0.1", port: int = 0) -> str:
        """Bind and serve; `host` None: this node's address in its Ray cluster (reachable from the platform)."""
        if host is None:
            import ray

            host = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        app = web.Application(client_max_size=self.limits.max_body_bytes, middlewares=[self._errors])
        app.add_routes(
            [
                web.post("/v1/chat/completions", self._chat),
                web.post("/v1/completions", self._completions),
                web.get("/v1/models", self._models),
                web.get("/v1/sessions/{session_id}/trajectory", self._trajectory),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        return f"http://{host}:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def open_session(self, session_id: str) -> None:
        """Open an `internal` session (a rollout worker's): the only way a record becomes trainable."""
        self.open_sessions([session_id])

    def open_sessions(self, session_ids: list[str]) -> None:
        """Open a group's internal sessions in one actor call; none is opened when one id is bad or taken."""
        for sid in session_ids:
            session_of(sid, None)
            if sid in self.sessions:
                raise ValueError(f"session {sid!r} already exists")
        if len(set(session_ids)) != len(session_ids):
            raise ValueError("session ids must be distinct")
        for sid in session_ids:
            self._new_state(sid, "internal")

    def trajectory(self, session_id: str) -> Trajectory:
        state = self.sessions.get(session_id)
        if state is None:
            raise KeyError(f"no session {session_id!r}")
        return state.record.model_copy(deep=True)

    async def end_session(self, session_id: str) -> Trajectory:
        """Free the session's engine cache and binding; returns its final record."""
        return (await self.end_sessions([session_id]))[0]

    async def end_sessions(self, session_ids: list[str]) -> list[Trajectory]:
        """End a group's sessions in one actor call: their final records in order (KeyError naming the first
        unknown id, before any is ended); their engines free the caches concurrently."""
        records, ending = self._end(session_ids)
        await self._free(ending)
        return records

    async def end_many(self, groups: list[list[str]]) -> list[list[Trajectory] | BaseException]:
        """`end_sessions` for several groups in one actor call, one cache-freeing call per engine for them all;
        one outcome per group, in order: its records, or the exception its `end_sessions` raised."""
        out: list[list[Trajectory] | BaseException] = []
        ending: dict[str, list[str]] = {}
        for sids in groups:
            try:
                records, frees = self._end(sids)
            except (KeyError, ValueError) as exc:
                out.append(exc)
                continue
            out.append(records)
            for engine, freed in frees.items():
                ending.setdefault(engine, []).extend(freed)
        await self._free(ending)
        return out

    def _end(self, session_ids: list[str]) -> tuple[list[Trajectory], dict[str, list[str]]]:
        """End the sessions (all or, on a bad id, none): their records, and per engine the sessions whose caches it
        still holds (a session answered with n choices had its rows freed when it was answered)."""
        for sid in session_ids:
            if sid not in self.sessions:
                raise KeyError(f"no session {sid!r}")
        if len(set(session_ids)) != len(session_ids):
            raise ValueError("session ids must be distinct")
        records: list[Trajectory] = []
        ending: dict[str, list[str]] = {}
        for sid in session_ids:
            state = self.sessions.pop(sid)
            engine = self.router.engine_of(sid)
            self.router.release(sid)
            freed = state.record.choices > 1  # answered with n choices: the engine freed its rows with the answer
            if engine is not None and engine in self.engines and not freed:
                ending.setdefault(engine, []).append(sid)
            state.record.state = "ended" if state.record.state == "open" else state.record.state
            records.append(state.record)
        return records, ending

    async def _free(self, ending: dict[str, list[str]]) -> None:
        frees = [call(self.engines[engine], "end_sessions", sids) for engine, sids in ending.items()]  # one per engine
        await asyncio.gather(*frees, return_exceptions=True)  # a dead engine holds no cache to free

    def engine_lost(self, engine_id: str, reason: str = "engine died") -> list[str]:
        """Stop routing to a dead engine; its sessions become tombstones (their next request: 410)."""
        if self.engines.pop(engine_id, None) is None:
            return []
        del self._turns[engine_id]
        return self.router.remove_engine(engine_id, reason=reason)

    def engine_added(self, engine_id: str, handle: Any) -> None:
        """Route new sessions to a (re)started engine; its predecessor's sessions stay tombstoned."""
        self.engine_lost(engine_id, reason="replaced by a restarted engine")
        self.engines[engine_id] = handle
        self._turns[engine_id] = CallCoalescer(handle, "generate_many")
        self.router.add_engine(engine_id)

    def stats(self) -> dict[str, Any]:
        idle = sum(1 for state in self.sessions.values() if state.api is None)
        return {
            "sessions": len(self.sessions) - idle,  # live: a request taken (opened ahead and unused: `idle`)
            "idle_sessions": idle,  # opened by a worker ahead of its groups (trainer/agent_episodes.py), no request yet
            "sessions_per_engine": self.router.in_flight(),
            "waiting": self.waiting,
            "requests": self.counts["requests"],
            "tokens": self.counts["tokens"],
            "status": {code: self.counts[code] for code in ("400", "401", "404", "409", "410", "413", "503")},
            "version": self.version,
            "engine_calls": sum(c.calls for c in self._turns.values()),  # generate_many calls: requests / calls
        }

    # --- HTTP ---------------------------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), b"Bearer " + self._key):
                raise ApiError(401, "missing or wrong bearer key", type="authentication_error")
            answer: web.StreamResponse = await handler(request)
            return answer
        except ApiError as exc:
            self.counts[str(exc.status)] += 1
            headers = {"Retry-After": str(self.limits.retry_after_s)} if exc.status == 503 else None
            return web.json_response(exc.body(), status=exc.status, headers=headers)

    async def _body(self, request: web.Request, model: Any) -> Any:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            limit = self.limits.max_body_bytes
            detail = f"request body over {limit} bytes"
            raise ApiError(
                413, detail, type="invalid_request_error", code="body_too_large", detail=detail, limit=limit
            ) from None
        return parse_body(model, parse_json(raw), self.limits)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        req = await self._body(request, ChatRequest)
        return await self._answer(request, req, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        req = await self._body(request, CompletionRequest)
        return await self._answer(request, req, "completions")

    async def _models(self, request: web.Request) -> web.StreamResponse:
        versions = []
        for handle in self.engines.values():
            try:
                async with asyncio.timeout(2):
                    versions.append(int((await call(handle, "snapshot"))["version"]))
            except Exception:  # noqa: BLE001 - a dead or slow engine does not hide the others
                continue
        self.version = max([self.version, *versions])
        return web.json_response(shapes.models(self.run, min(versions, default=self.version)))

    async def _trajectory(self, request: web.Request) -> web.StreamResponse:
        sid = request.match_info["session_id"]
        if sid not in self.sessions:
            raise ApiError(404, f"no session {sid!r}", type="not_found_error", param="session_id")
        return web.json_response(self.trajectory(sid).model_dump())
