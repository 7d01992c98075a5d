"""ASGI middleware: an HTTP request body over its cap is answered 413 before Django reads a byte of it.

The cap of a path is the first of settings.BODY_LIMITS whose regex matches it, else MAX_BODY_BYTES (ingest
4 MiB, sign-in 16 KiB, the rest 1 MiB by default: config/security.py, docs/security.md "Size limits"). A
declared Content-Length over the cap is refused at once, without reading the body; otherwise the body is read
here, counting its bytes as they come, so a chunked body or one longer than its Content-Length is refused as
soon as it passes the cap. Within the cap the body is handed to Django as one message. The answer is 413
`{"detail", "limit"}`, the same as the API parser's own cap (runs/api/parsers.py), which stays as a second
line for requests that do not come through this app (the test client).

Under daphne, twisted receives the whole body (spooled to a temporary file) before the application starts, and
daphne then queues all of it for the application at once: a 100 MB POST would be 100 MB in the web process
whatever the application answers. daphne_body_ceiling() (called by config/asgi.py when daphne serves it) makes
daphne's request keep at most one byte more than its path's cap, so such a body costs no more than one at the
cap; the truncated body is still over the cap, so it is refused here like the whole one.

malloc_give_back() (also called by config/asgi.py) fixes glibc's mmap threshold at 128 KiB: by default glibc
raises it each time a large buffer is freed, after which bodies, their copies and decoded strings come from the
heap and their memory stays with the process; measured by tests/security/test_body_limits.py, the peak of
daphne grew 26-36 MB across its hostile bodies without it and 16 MB with it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import re
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]  # Django's handler types its arguments more narrowly


def body_limit(path: str) -> int:
    """The body cap of a request path (the same rule as runs.api.parsers.body_limit)."""
    for pattern, limit in getattr(settings, "BODY_LIMITS", ()):
        if re.fullmatch(pattern, path):
            return int(limit)
    return int(getattr(settings, "MAX_BODY_BYTES", 1024 * 1024))


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, or None when absent or not a plain number (then only counting applies)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isascii() and text.isdigit() else None
    return None


async def too_large(send: Send, limit: int) -> None:
    body = json.dumps({"detail": f"body: larger than the limit of {limit} bytes", "limit": limit}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """Wraps the HTTP application (config/asgi.py); websockets are capped by daphne and the consumers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = body_limit(scope.get("path", ""))
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            return await too_large(send, limit)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left; there is nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await too_large(send, limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        pending = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
        chunks.clear()

        async def replay() -> Message:
            # The whole body once (dropped from here as Django takes it), then the client's own messages
            # (Django listens for http.disconnect while it answers).
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)


def daphne_body_ceiling() -> None:
    """When daphne serves this process, keep at most (the path's cap + 1) bytes of each request's body (above)."""
    protocol = sys.modules.get("daphne.http_protocol")
    if protocol is None or getattr(protocol.WebRequest, "body_kept", None) is not None:
        return

    class CeilingRequest(protocol.WebRequest):  # type: ignore[name-defined,misc]
        body_kept: int | None = None  # bytes of the body still to keep; None until the first chunk

        def handleContentChunk(self, data: bytes) -> None:  # noqa: N802 - twisted's name
            if self.body_kept is None:
                # Twisted parsed the request line before the body: its path picks the cap, as in the middleware.
                target = urlsplit(getattr(self.channel, "_path", b"") or b"").path.decode("latin-1")
                self.body_kept = body_limit(unquote(target)) + 1
            kept = data[: self.body_kept]
            self.body_kept -= len(kept)
            if kept:
                super().handleContentChunk(kept)

    # daphne's HTTPFactory.buildProtocol looks the name up at each connection.
    setattr(protocol, "WebRequest", CeilingRequest)  # noqa: B010 - a module of daphne's, typed as ModuleType


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def malloc_give_back(threshold: int = 128 * 1024) -> bool:
    """Serve allocations of `threshold` bytes or more with their own mappings, returned to the system when freed
    (glibc only; elsewhere nothing happens). True when set."""
    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL(name).mallopt(M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
