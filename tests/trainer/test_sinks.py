"""Event sinks: JSON lines that continue their seq, HTTP batches with retries against a real local server, and the
HTTP sink's heartbeat posts."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.wait import wait_until
from trainer.events import EventSchemaError, validate_event
from trainer.sinks import EventEmitter, HttpSink, JsonlSink


class Ingest:
    """A stand-in for the platform's ingest endpoint with scripted misbehaviour."""

    def __init__(self, script: list[str], heartbeat_code: int = 200) -> None:
        self.script = list(script)  # per event post: "ok", "slow" (past the client timeout, then stores), "409"
        self.stored: dict[int, dict] = {}
        self.auth: list[str | None] = []
        self.requests = 0
        self.heartbeats: list[tuple[float, str | None]] = []  # (monotonic time, Authorization) of each empty post
        self.heartbeat_code = heartbeat_code
        # what every reply carries under "commands" (staff commands, runs/execution/controls.py)
        self.commands: list = []
        ingest = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if body == {"events": []}:  # a heartbeat: answered, not scripted
                    ingest.heartbeats.append((time.monotonic(), self.headers.get("Authorization")))
                    reply = json.dumps({"commands": ingest.commands}).encode()
                    self.send_response(ingest.heartbeat_code)
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                    return
                ingest.requests += 1
                ingest.auth.append(self.headers.get("Authorization"))
                action = ingest.script.pop(0) if ingest.script else "ok"
                if action == "slow":
                    time.sleep(0.6)
                for e in body:
                    ingest.stored.setdefault(e["seq"], e)  # idempotent by seq, like the platform
                code = 409 if action == "409" else 200
                payload = json.dumps({"stored": len(body)}).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except BrokenPipeError:
                    pass

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/runs/1/ingest/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def test_jsonl_sink_writes_valid_events_and_continues_seq_after_restart(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    em = EventEmitter([JsonlSink(path)], run=7)
    em.emit("status", {"status": "running"})
    em.emit("sampler", {"epoch": 0, "group_count": 3, "dataset_size": 10, "consumed_in_epoch": 3})
    em.close()
    em2 = EventEmitter([JsonlSink(path)], run=7)  # a resumed job appends
    em2.emit("log", {"level": "info", "message": "resumed"})
    em2.close()
    events = [validate_event(json.loads(line)) for line in path.read_text().splitlines()]
    assert [e.seq for e in events] == [1, 2, 3]
    assert [e.type for e in events] == ["status", "sampler", "log"]


def test_emitter_refuses_events_that_break_the_schema() -> None:
    em = EventEmitter([])
    with pytest.raises(EventSchemaError, match="train event lacks"):
        em.emit("train", {"step": 1})


def test_emitter_refuses_fields_the_schema_does_not_declare() -> None:
    """The platform drops undeclared fields: the emitter refuses them instead, top level and nested, so a field
    the trainer sends but the schema forgot fails the run's own tests, not silently the run page."""
    em = EventEmitter([])
    started = {"event": "started", "engines": ["engine-0"], "workers": 2, "mode": "colocated", "device": "cpu"}
    em.emit("worker", {**started, "num_gpus": 0.0})
    with pytest.raises(EventSchemaError, match=r"^data\.shiny: not declared"):
        em.emit("worker", {**started, "shiny": 1})
    gate = {"state": "open", "version": 0, "active": 0, "waiting": 0}
    em.emit("gate", {**gate, "engines": [{"engine": "engine-0", "state": "open"}]})
    with pytest.raises(EventSchemaError, match=r"^data\.engines\[0\]\.extra: not declared"):
        em.emit("gate", {**gate, "engines": [{"engine": "engine-0", "extra": 1}]})


def test_http_sink_batches_with_bearer_token_and_retries_read_timeouts(monkeypatch) -> None:
    monkeypatch.setenv("RUN_INGEST_TOKEN", "tok-123")
    server = Ingest(["slow", "ok"])
    try:
        sink = HttpSink(server.url, timeout_s=0.3, flush_interval_s=0.05)
        em = EventEmitter([sink])
        for i in range(5):
            em.emit("log", {"level": "info", "message": f"m{i}"})
        em.close(timeout_s=10)
        assert sorted(server.stored) == [1, 2, 3, 4, 5]  # the timed-out post was re-sent, no duplicates kept
        assert server.requests >= 2
        assert set(server.auth) == {"Bearer tok-123"}
        assert sink.delivered == 5 and sink.dropped == 0
    finally:
        server.close()


def test_http_sink_retries_connection_failures_until_the_server_is_up() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api/runs/1/ingest/"
    import requests

    refused: list[str] = []

    class Counting(requests.Session):  # the sink's own session, counting the posts refused while no server listens
        def post(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            try:
                return super().post(*args, **kwargs)
            except requests.ConnectionError as exc:
                refused.append(type(exc).__name__)
                raise

    sink = HttpSink(url, token="t", flush_interval_s=0.05, timeout_s=1.0, session=Counting())
    em = EventEmitter([sink])
    em.emit("log", {"level": "info", "message": "before the server"})
    wait_until(lambda: len(refused) >= 2, timeout=15, what="two refused posts (the sink retries)")
    server = None
    try:
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            got: list = []

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                Handler.got += body if isinstance(body, list) else []  # {"events": []}: a heartbeat
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        em.close(timeout_s=15)
        assert [e["seq"] for e in Handler.got] == [1]
    finally:
        if server is not None:
            server.shutdown()


def test_flush_posts_now_and_returns_once_every_event_is_posted() -> None:
    """A job flushes before stopping its session server (trainer/loop.py): the events written so far are posted
    now, not at the next interval, and flush returns once they are, or False at its timeout."""
    server = Ingest(["slow", "ok"])
    try:
        sink = HttpSink(server.url, token="t", flush_interval_s=60, timeout_s=5)  # only a flush sends early
        em = EventEmitter([sink])
        em.emit("status", {"status": "running", "version": 0})
        started = time.monotonic()
        assert sink.flush(timeout_s=10) is True  # its post answered after 0.6 s ("slow"), and flush waited
        assert 0.6 <= time.monotonic() - started < 5 and sorted(server.stored) == [1]
        em.emit("status", {"status": "succeeded", "version": 3})
        assert sink.flush(timeout_s=5) is True
        assert sorted(server.stored) == [1, 2] and sink.delivered == 2
        assert sink.flush(timeout_s=1) is True  # nothing left: at once
        server.script = ["slow"]
        em.emit("log", {"level": "info", "message": "late"})
        assert sink.flush(timeout_s=0.2) is False  # still posting at the timeout
        em.close(timeout_s=10)
        assert sorted(server.stored) == [1, 2, 3]
    finally:
        server.close()


def test_http_409_means_the_run_is_over() -> None:
    server = Ingest(["409"])
    try:
        sink = HttpSink(server.url, token="t", flush_interval_s=0.05)
        em = EventEmitter([sink])
        em.emit("log", {"level": "info", "message": "x"})
        wait_until(lambda: em.stop_requested, timeout=5, what="the emitter to see the 409")
        em.close()
    finally:
        server.close()


def test_staff_commands_in_replies_reach_the_emitter_once_each_and_malformed_ones_are_ignored() -> None:
    server = Ingest([])
    command = {"id": 4, "kind": "gate_reset", "reason": "request lost", "requested_by": "root"}
    server.commands = [command, {"id": "5", "kind": "gate_reset"}, {"id": 6, "kind": "rm -rf"}, "junk"]
    try:
        sink = HttpSink(server.url, token="t", flush_interval_s=0.05, heartbeat_s=0.1)
        em = EventEmitter([sink])
        wait_until(lambda: em.commands() == [command], timeout=10, what="the command from a heartbeat reply")
        wait_until(lambda: sink.heartbeats >= 3, timeout=10, what="more replies carrying the same command")
        assert em.commands() == [command]  # kept once, by id
        em.close()
    finally:
        server.close()


def test_http_sink_heartbeats_from_construction_until_close_without_any_event(monkeypatch) -> None:
    monkeypatch.setenv("RUN_INGEST_TOKEN", "tok-9")
    server = Ingest([])
    try:
        t0 = time.monotonic()
        sink = HttpSink(server.url, heartbeat_s=0.2)
        wait_until(lambda: len(server.heartbeats) >= 4, timeout=10, what="four heartbeats")
        assert server.heartbeats[0][0] - t0 < 1.0  # the first one right away
        gaps = [b[0] - a[0] for a, b in zip(server.heartbeats, server.heartbeats[1:])]
        assert all(0.1 < g < 1.5 for g in gaps), gaps
        assert {auth for _, auth in server.heartbeats} == {"Bearer tok-9"}
        # The sink counts a heartbeat once its answer is back, just after the server recorded it.
        wait_until(lambda: sink.heartbeats >= 4, timeout=10, what="the sink to count four heartbeats")
        assert server.requests == 0 and sink.delivered == 0
        sink.close(timeout_s=2)
        after = len(server.heartbeats)
        time.sleep(0.6)
        assert len(server.heartbeats) == after  # stopped on close
    finally:
        server.close()


def test_a_409_answer_to_a_heartbeat_requests_the_stop() -> None:
    server = Ingest([], heartbeat_code=409)
    try:
        em = EventEmitter([HttpSink(server.url, token="t", heartbeat_s=0.2)])
        wait_until(lambda: em.stop_requested, timeout=5, what="the emitter to see the heartbeat's 409")
        em.close(timeout_s=2)
    finally:
        server.close()


def test_heartbeats_keep_coming_while_an_event_post_is_being_retried() -> None:
    server = Ingest(["slow", "slow", "slow", "ok"])  # each slow answer outlasts the client timeout
    try:
        sink = HttpSink(server.url, token="t", timeout_s=0.3, flush_interval_s=0.05, heartbeat_s=0.2)
        em = EventEmitter([sink])
        em.emit("log", {"level": "info", "message": "stuck a while"})
        wait_until(lambda: sorted(server.stored) == [1], timeout=15, what="the event after three retries")
        before_event = [t for t, _ in server.heartbeats]
        assert len(before_event) >= 3, before_event
        em.close(timeout_s=5)
    finally:
        server.close()
