"""A stand-in for a run's session server (agents/server.py) at the boundary the platform's proxy talks to: a real
aiohttp server on 127.0.0.1, in a thread of its own, answering the OpenAI routes with the shapes the session
server answers (chat completions plain and SSE, completions, models, a session's trajectory), requiring the
run's serving key, and recording what reached it. A chat request whose last message is `slow` streams for a
long time, one chunk per 50 ms, and records when its client went away."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from aiohttp import web

from tests.realtime.servers import free_port

SLOW_CHUNKS = 400


class SessionServerDouble:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.keys: set[str] = set()  # serving keys accepted
        self.seen: list[dict[str, Any]] = []  # {method, path, headers, body} of every request that reached it
        self.slow_sent = 0  # chunks the slow stream sent before its client went away (or all of them)
        self.slow_closed = threading.Event()  # set when the slow stream's client went away
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> SessionServerDouble:
        self._thread.start()
        assert self._ready.wait(10), "the session server double did not start"
        return self

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/sessions/{session}/trajectory", self._trajectory)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    async def _record(self, request: web.Request) -> dict[str, Any] | None:
        body = await request.json() if request.can_read_body else None
        self.seen.append(
            {"method": request.method, "path": request.path, "headers": dict(request.headers), "body": body}
        )
        return body

    def _refused(self, request: web.Request) -> web.Response | None:
        presented = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if presented not in self.keys:
            return web.json_response(
                {"error": {"message": "bad serving key", "type": "authentication_error"}}, status=401
            )
        return None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        refused = self._refused(request)
        body = await self._record(request)
        if refused is not None:
            return refused
        assert body is not None
        text = str(body["messages"][-1].get("content"))
        if not body.get("stream"):
            return web.json_response(_completion(body, f"echo: {text}"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        if text == "slow":
            return await self._slow(response, body)
        for piece in ("echo", ": ", text):
            await response.write(_sse(_chunk(body, {"content": piece}, None)))
        await response.write(_sse(_chunk(body, {}, "stop")))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _slow(self, response: web.StreamResponse, body: dict[str, Any]) -> web.StreamResponse:
        try:
            for _ in range(SLOW_CHUNKS):
                await response.write(_sse(_chunk(body, {"content": "."}, None)))
                self.slow_sent += 1
                await asyncio.sleep(0.05)
        except (ConnectionError, asyncio.CancelledError):
            self.slow_closed.set()
            raise
        return response

    async def _completions(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        body = await self._record(request)
        if refused is not None:
            return refused
        assert body is not None
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model", "m"),
                "choices": [{"index": 0, "text": f"echo: {body['prompt']}", "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
            }
        )

    async def _models(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        await self._record(request)
        return refused or web.json_response(
            {"object": "list", "data": [{"id": "run@v3", "object": "model", "created": 0, "owned_by": "rlcp"}]}
        )

    async def _trajectory(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        await self._record(request)
        session = request.match_info["session"]
        segment = {"request_id": "r1", "completion_ids": [5, 6], "versions": [3, 3], "finish_reason": "stop"}
        return refused or web.json_response({"session_id": session, "segments": [segment]})


def _completion(body: dict[str, Any], text: str) -> dict[str, Any]:
    """A chat.completion with the session server's extras: `rl` (the version of every token) and, when asked,
    `logprobs.content` (one entry per token: here one per character, the first half at version 3, then 4)."""
    versions = [3 if i < len(text) // 2 else 4 for i in range(len(text))]
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    if body.get("logprobs"):
        choice["logprobs"] = {"content": [{"token": c, "logprob": -0.5, "bytes": list(c.encode())} for c in text]}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "run@v3"),
        "choices": [choice],
        "usage": {"prompt_tokens": 1, "completion_tokens": len(text), "total_tokens": 1 + len(text)},
        "session_id": body.get("session_id"),
        "rl": {"request_id": "r1", "engine": "engine-0", "version": 3, "versions": versions, "token_ids": []},
    }


def _chunk(body: dict[str, Any], delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.get("model", "m"),
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()
