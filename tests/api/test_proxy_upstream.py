"""The proxy's wire to a session server (runs/api/proxy_upstream.py `forward`) against real aiohttp servers on
127.0.0.1, in process: what each failure answers (refused 502, silent 504, over the cap 502, a refused key moves
to the next), what crosses each way, that a redirect is relayed and never followed, that a stream is relayed and
cut at the cap, and that a crowd of requests reuses pooled connections. The whole path through daphne, with
auth, is tests/api/test_agent_proxy.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from runs.api import proxy_upstream
from tests.conftest import free_port

EVENT = b"data: " + b"x" * 93 + b"\n\n"  # 101 bytes
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Upstream:
    """An aiohttp app on a free port that records each request's headers and client port."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.seen: list[dict[str, Any]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def _any(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.seen.append({"headers": dict(request.headers), "client_port": peer[1] if peer else None})
        return await self.handler(request)

    async def __aenter__(self) -> Upstream:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._any)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await proxy_upstream.close()
        await self.runner.cleanup()


async def send(url: str, keys: list[str] | None = None, body: dict | None = None) -> Any:
    return await proxy_upstream.forward(
        method="POST" if body is not None else "GET",
        url=url,
        keys=keys or ["k1"],
        body=body,
        session="ext-1-s",
        extra={"X-Session-Id": "s"},
    )


def detail(answer: Any) -> str:
    return json.loads(answer.content)["detail"]


def test_a_server_that_is_not_there_is_502_and_a_silent_one_504(settings) -> None:
    settings.AGENT_PROXY_READ_TIMEOUT_SECONDS = 0.3

    async def silent(request: web.Request) -> web.Response:
        await asyncio.sleep(1.5)
        return web.json_response({})

    async def main() -> None:
        nobody = await send(f"http://127.0.0.1:{free_port()}/v1/models")
        assert nobody.status_code == 502 and "could not be reached" in detail(nobody)
        async with Upstream(silent) as up:
            late = await send(f"{up.url}/v1/models")
        assert late.status_code == 504 and "did not answer in time" in detail(late)
        assert json.loads(late.content)["error"]["type"] == "api_error"

    asyncio.run(main())


def test_an_answer_over_the_cap_is_502_and_a_stream_over_it_is_cut(settings) -> None:
    settings.AGENT_PROXY_MAX_ANSWER_BYTES = 1000

    async def big(request: web.Request) -> web.StreamResponse:
        if "stream" in request.path:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for _ in range(5 if request.path.endswith("short") else 50):
                await response.write(EVENT)
                await asyncio.sleep(0.002)
            await response.write_eof()
            return response
        return web.Response(body=b"y" * 5000, content_type="application/json")

    async def main() -> None:
        async with Upstream(big) as up:
            whole = await send(f"{up.url}/v1/models")
            assert whole.status_code == 502 and "more than 1000 bytes" in detail(whole)
            short = await send(f"{up.url}/v1/stream/short")
            assert short.status_code == 200 and short["Content-Type"] == "text/event-stream"
            assert b"".join([chunk async for chunk in short.streaming_content]) == EVENT * 5
            # Cut before the chunk that passes the cap (the chunks are as they arrived: whole events here).
            cut = b"".join([chunk async for chunk in (await send(f"{up.url}/v1/stream")).streaming_content])
            assert len(cut) <= 1000 and cut == EVENT * (len(cut) // len(EVENT))

    asyncio.run(main())


def test_a_refused_key_moves_on_to_the_next_and_only_safe_headers_cross() -> None:
    async def second_key_only(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer k2":
            return web.json_response({"error": "bad key"}, status=401)
        answer = web.json_response({"ok": True}, headers={"Set-Cookie": "a=b", "Retry-After": "3"})
        answer.headers["X-Internal"] = "secret"
        return answer

    async def main() -> None:
        async with Upstream(second_key_only) as up:
            answer = await send(f"{up.url}/v1/chat/completions", keys=["k1", "k2"], body={"messages": []})
            refused = await send(f"{up.url}/v1/models", keys=["k1", "k3"])
        assert answer.status_code == 200 and json.loads(answer.content) == {"ok": True}
        assert answer["Retry-After"] == "3" and answer["X-Session-Id"] == "s"
        assert "Set-Cookie" not in answer and "X-Internal" not in answer
        assert [s["headers"]["Authorization"] for s in up.seen[:2]] == ["Bearer k1", "Bearer k2"]
        sent = up.seen[1]["headers"]
        assert sent["X-Session-Id"] == "ext-1-s" and sent["Accept-Encoding"] == "identity"
        assert sent["Content-Type"] == "application/json" and "Cookie" not in sent
        assert refused.status_code == 502 and "refused the platform's serving key" in detail(refused)

    asyncio.run(main())


def test_a_redirect_is_relayed_never_followed() -> None:
    async def redirect(request: web.Request) -> web.Response:
        if request.path != "/v1/models":
            raise AssertionError(f"followed to {request.path}")
        return web.Response(status=302, headers={"Location": "http://169.254.169.254/latest/meta-data/"})

    async def main() -> None:
        async with Upstream(redirect) as up:
            answer = await send(f"{up.url}/v1/models")
        assert answer.status_code == 302 and "Location" not in answer
        assert len(up.seen) == 1

    asyncio.run(main())


@pytest.mark.parametrize("crowd", [64])
def test_a_crowd_reuses_pooled_connections(crowd: int) -> None:
    async def slow_ok(request: web.Request) -> web.Response:
        await asyncio.sleep(0.01)
        return web.json_response({"ok": True})

    async def main() -> None:
        async with Upstream(slow_ok) as up:
            for _ in range(3):  # three waves of `crowd` requests at once
                answers = await asyncio.gather(*(send(f"{up.url}/v1/models") for _ in range(crowd)))
                assert {a.status_code for a in answers} == {200}
        ports = {s["client_port"] for s in up.seen}
        assert len(up.seen) == 3 * crowd and len(ports) <= crowd  # later waves ride the first wave's connections

    asyncio.run(main())
