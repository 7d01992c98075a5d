"""One POST of a delivery: the signed body and headers, sent to the address the SSRF check passed
(runs/webhooks/targets.py), with short timeouts (to connect, per read, and for the whole attempt), no redirect
followed and at most RESPONSE_READ_MAX bytes of the answer read. Pure of Django: the task
(runs/webhooks/tasks.py) records what it returns.

Signature: `X-RLCP-Signature: sha256=<hex>`, HMAC-SHA256 keyed with the subscription's secret over
`f"{timestamp}.{body}"`, where timestamp is `X-RLCP-Timestamp` (unix seconds) and body the raw request body."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any

from runs.webhooks.targets import Target

CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 5.0  # per read: a receiver answering a byte at a time would renew it
TOTAL_TIMEOUT_S = 10.0  # the whole attempt: the connection is shut once it has passed
RESPONSE_READ_MAX = 1024
USER_AGENT = "rlcp-webhooks/1"


def body_encode(*, delivery_id: str, event: str, run: int | None, at: float, data: Any) -> bytes:
    payload = {"delivery_id": delivery_id, "event": event, "run": run, "at": at, "data": data}
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


@dataclass(frozen=True)
class Answer:
    status_code: int | None  # None: no HTTP answer
    error: str  # why there was none, or ""
    latency_ms: float

    @property
    def accepted(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to the checked address, with the URL's host as TLS server name (its certificate is checked)."""

    def __init__(self, target: Target, **kwargs: Any) -> None:
        super().__init__(target.host, target.port, context=ssl.create_default_context(), **kwargs)
        self._address = target.address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), timeout=CONNECT_TIMEOUT_S)
        sock.settimeout(READ_TIMEOUT_S)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, target: Target, **kwargs: Any) -> None:
        super().__init__(target.host, target.port, **kwargs)
        self._address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), timeout=CONNECT_TIMEOUT_S)
        self.sock.settimeout(READ_TIMEOUT_S)


def post(target: Target, *, secret: str, delivery_id: str, body: bytes) -> Answer:
    """POST `body` once; the answer's status (a redirect is an answer, not followed) or the error."""
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-RLCP-Delivery": delivery_id,
        "X-RLCP-Timestamp": str(timestamp),
        "X-RLCP-Signature": signature(secret, timestamp, body),
    }
    cls = _PinnedHTTPS if target.scheme == "https" else _PinnedHTTP
    conn = cls(target, timeout=READ_TIMEOUT_S)
    started = time.monotonic()
    deadline = threading.Timer(TOTAL_TIMEOUT_S, _shut, [conn])
    deadline.daemon = True
    deadline.start()
    try:
        conn.request("POST", target.path, body=body, headers=headers)
        response = conn.getresponse()
        response.read(RESPONSE_READ_MAX)
        return Answer(response.status, "", (time.monotonic() - started) * 1000)
    except (OSError, http.client.HTTPException) as exc:
        return Answer(None, f"{type(exc).__name__}: {exc}"[:300], (time.monotonic() - started) * 1000)
    finally:
        deadline.cancel()
        conn.close()


def _shut(conn: http.client.HTTPConnection) -> None:
    """End an attempt past TOTAL_TIMEOUT_S: its blocked read returns (an error: retried like any other)."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
