"""A real HTTP receiver of webhooks in a thread: records each POST (headers, raw body, arrival time) and answers
500 to its first `failures` requests of each delivery id, then 204."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self, *, failures: int = 0) -> None:
        self.failures = failures
        self.requests: list[dict[str, Any]] = []
        self.tries: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                delivery = self.headers.get("X-RLCP-Delivery", "")
                with receiver.lock:
                    receiver.tries[delivery] += 1
                    failing = receiver.tries[delivery] <= receiver.failures
                    receiver.requests.append(
                        {
                            "headers": dict(self.headers),
                            "body": body,
                            "at": time.time(),
                            "status": 500 if failing else 204,
                        }
                    )
                    receiver.arrived.notify_all()
                self.send_response(500 if failing else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def accepted(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if r["status"] == 204]

    def wait_accepted(self, n: int, timeout: float = 30) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self.lock:
            while sum(r["status"] == 204 for r in self.requests) < n and time.monotonic() < deadline:
                self.arrived.wait(0.2)
        return self.accepted()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def signature_valid(request: dict[str, Any], secret: str) -> bool:
    """The receiver's check, as docs/api.md shows it."""
    timestamp = request["headers"]["X-RLCP-Timestamp"]
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + request["body"], hashlib.sha256).hexdigest()
    return hmac.compare_digest(request["headers"]["X-RLCP-Signature"], f"sha256={expected}")


def payload(request: dict[str, Any]) -> dict[str, Any]:
    return json.loads(request["body"])
