"""ASGI middleware: an HTTP request body over its cap is answered 413 before Django reads a byte of it.

The cap of a path is the first of settings.BODY_LIMITS whose regex matches it, else MAX_BODY_BYTES (ingest
4 MiB, sign-in 16 KiB, the rest 1 MiB by default: config/security.py, docs/security.md "Size limits"). A
declared Content-Length over the cap is refused at once, without reading the body; otherwise the body is read
here, counting its bytes as they come, so a chunked body or one longer than its Content-Length is refused as
soon as it passes the cap. Within the cap the body is handed to Django as one message. The answer is 413
`{"detail", "limit"}`, the same as the API parser's own cap (runs/api/parsers.py), which stays as a second
line for requests that do not come through this app (the test client).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


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
