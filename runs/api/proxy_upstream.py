"""The proxy's side of the wire to a run's session server: one pooled aiohttp.ClientSession per event loop (no
environment proxies, no redirects followed, connect and per-read timeouts from settings, `Accept-Encoding:
identity` so that what is relayed is what was sent), the run's serving key in `Authorization`, and the answer
relayed: a streamed one (`text/event-stream`) chunk by chunk through an async iterator that closes the upstream
response when the client goes away, any other one read whole up to its cap. Only safe headers cross, each way.
Failures to reach the server answer 502 (refused, reset, its answer over the cap, or it refused the platform's
key) or 504 (timed out), in the OpenAI error shape.

Why one session per loop: building a client costs ~80 ms of CPU for its TLS context, so a client per request
stalled the web process's loop under a crowd. Why aiohttp: httpx's pool (httpcore) checked every pooled
connection on every request (`has_expired`, a `getpeername` each); with 64 agents in flight (bench/agents.py's
proxy load) `forward` was 29% of daphne's CPU on httpx and is 4% on aiohttp, whose connector takes an idle
connection off a per-host list (py-spy), and daphne's CPU per proxied request fell from 11-12 ms to 7-8.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import aiohttp
from django.conf import settings
from django.http import HttpResponse, HttpResponseBase, StreamingHttpResponse

log = logging.getLogger(__name__)
R = TypeVar("R", bound=HttpResponseBase)
# Headers of the session server's answer that reach the client (all others, cookies included, are dropped).
ANSWER_HEADERS = ("content-type", "retry-after", "x-request-id")
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}
POOL_CONNECTIONS = 512  # connections open at once to all session servers (idle ones kept for reuse)


def error_answer(
    status: int, message: str, *, field: str | None = None, headers: dict[str, str] | None = None
) -> HttpResponse:
    """The platform's error body (`detail`, `field`) with OpenAI's (`error`) beside it, so both kinds of client
    read it."""
    detail = f"{field}: {message}" if field else message
    body = {
        "detail": detail,
        "field": field,
        "error": {"message": detail, "type": ERROR_TYPES.get(status, "api_error"), "param": field, "code": None},
    }
    answer = HttpResponse(json.dumps(body), status=status, content_type="application/json")
    for name, value in (headers or {}).items():
        answer[name] = value
    return answer


_SESSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = weakref.WeakKeyDictionary()


def _session() -> aiohttp.ClientSession:
    """This event loop's session (daphne runs one loop; a session is bound to the loop it was made on)."""
    loop = asyncio.get_running_loop()
    session = _SESSIONS.get(loop)
    if session is None or session.closed:
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=settings.AGENT_PROXY_CONNECT_TIMEOUT_SECONDS,
            sock_read=settings.AGENT_PROXY_READ_TIMEOUT_SECONDS,
        )
        session = aiohttp.ClientSession(
            timeout=timeout,
            connector=aiohttp.TCPConnector(limit=POOL_CONNECTIONS),
            trust_env=False,  # never an environment's HTTP proxy
            auto_decompress=False,  # asked for identity; a compressed answer would be relayed as it came
        )
        _SESSIONS[loop] = session
    return session


async def close() -> None:
    """Close this event loop's session (tests; daphne's lives as long as its loop)."""
    session = _SESSIONS.pop(asyncio.get_running_loop(), None)
    if session is not None:
        await session.close()


async def forward(
    *, method: str, url: str, keys: list[str], body: dict[str, Any] | None, session: str, extra: dict[str, str]
) -> HttpResponseBase:
    """Send the request to the session server and relay its answer. `keys`: the run's serving keys, current
    first (a 401 from the server moves on to the next). `session`: the namespaced session id (X-Session-Id
    upstream); `extra`: headers added to the answer (the caller's own session id)."""
    client = _session()
    content = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
    try:
        answer = None
        for key in keys:
            headers = {
                "Authorization": f"Bearer {key}",
                "X-Session-Id": session,
                "Accept": "application/json, text/event-stream",
                "Accept-Encoding": "identity",
            }
            if content is not None:
                headers["Content-Type"] = "application/json"
            answer = await client.request(method, url, data=content, headers=headers, allow_redirects=False)
            if answer.status != 401:
                break
            answer.release()
        assert answer is not None  # keys is never empty
        if answer.status == 401:
            log.warning("the session server at %s refused the run's serving key", url)
            return error_answer(502, "the run's session server refused the platform's serving key")
    except TimeoutError:  # aiohttp's timeouts (connect, read) are TimeoutErrors
        return error_answer(504, "the run's session server did not answer in time")
    except aiohttp.ClientError as exc:
        return error_answer(502, f"the run's session server could not be reached ({type(exc).__name__})")
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        return _streamed(answer, extra)
    return await _whole(answer, extra)


def _relayed_headers(answer: aiohttp.ClientResponse, response: R, extra: dict[str, str]) -> R:
    for name in ANSWER_HEADERS:
        if name in answer.headers:
            response[name] = answer.headers[name]
    for name, value in extra.items():
        response[name] = value
    return response


async def _whole(answer: aiohttp.ClientResponse, extra: dict[str, str]) -> HttpResponse:
    cap = settings.AGENT_PROXY_MAX_ANSWER_BYTES
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in answer.content.iter_any():
            size += len(chunk)
            if size > cap:
                return error_answer(502, f"the run's session server answered more than {cap} bytes")
            chunks.append(chunk)
    except TimeoutError:
        return error_answer(504, "the run's session server did not finish its answer in time")
    except aiohttp.ClientError as exc:
        return error_answer(502, f"the run's session server broke off its answer ({type(exc).__name__})")
    finally:
        answer.release()  # back to the pool when read to its end; closed when it was not
    response = HttpResponse(b"".join(chunks), status=answer.status)
    return _relayed_headers(answer, response, extra)


def _streamed(answer: aiohttp.ClientResponse, extra: dict[str, str]) -> StreamingHttpResponse:
    cap = settings.AGENT_PROXY_MAX_ANSWER_BYTES

    async def chunks() -> AsyncIterator[bytes]:
        # Django cancels the task iterating this when the client disconnects (its ASGI handler listens for
        # http.disconnect): the `finally` then closes the upstream response, which ends the server's stream.
        size = 0
        try:
            async for chunk in answer.content.iter_any():
                size += len(chunk)
                if size > cap:
                    log.warning("a streamed answer passed %s bytes; cut", cap)
                    return
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:  # the headers are sent: all that is left is to end it
            log.warning("the session server's stream broke off: %s", type(exc).__name__)
        finally:
            answer.close()

    response = StreamingHttpResponse(chunks(), status=answer.status)
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a buffering front proxy would hold the tokens back
    return _relayed_headers(answer, response, extra)
