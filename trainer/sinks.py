"""Where run events go: JSON lines to a file, or batched HTTP POSTs to the platform's ingest URL.

`EventEmitter` numbers and validates events (trainer.events is the one schema); sinks only deliver them.
HTTP delivery retries connection failures, read timeouts and 5xx answers: re-posting is safe because the
platform ingests idempotently by the emitter's seq. A 409 means the run is finished: `stop_requested` is set.
The HTTP sink also heartbeats: from its construction until close, a thread of its own posts `{"events": []}`
every HEARTBEAT_SECONDS, whatever the run is doing (importing torch, waiting for its placement group,
training); the platform stamps `heartbeat_at` on every accepted post.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol, cast

from trainer.event_declared import undeclared_fields
from trainer.event_schema import data_fit
from trainer.events import CONTROL_KINDS, ControlCommand, EventDict, EventSchemaError, validate_event
from trainer.post_packing import POST_MAX_EVENTS, next_post, refused_event

TOKEN_ENV = "RUN_INGEST_TOKEN"
# The platform's launcher hands the token over in a 0600 file, not in the job's env (which the Ray job API shows).
TOKEN_FILE_ENV = "RUN_INGEST_TOKEN_FILE"
# Seconds between the HTTP sink's empty heartbeat posts.
HEARTBEAT_SECONDS = 5.0


def ingest_token_from_env() -> str:
    """The run's ingest token: read from $RUN_INGEST_TOKEN_FILE if set, else $RUN_INGEST_TOKEN, else ''."""
    path = os.environ.get(TOKEN_FILE_ENV)
    if path:
        return Path(path).read_text(encoding="utf-8").strip()
    return os.environ.get(TOKEN_ENV, "")


class EventSink(Protocol):
    stop_requested: bool

    def write(self, event: EventDict) -> None: ...

    def close(self, timeout_s: float = 10.0) -> None: ...


class JsonlSink:
    """Appends one JSON object per line and flushes, so a crash loses at most the event being written."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.last_seq = _last_seq(self.path)  # a resumed run appends after the previous seq
        self._file = open(self.path, "a", encoding="utf-8")
        self.stop_requested = False

    def write(self, event: EventDict) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self, timeout_s: float = 10.0) -> None:
        self._file.close()


def _last_seq(path: Path) -> int:
    if not path.exists():
        return 0
    last = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                last = max(last, int(json.loads(line)["seq"]))
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line from a crash
    return last


class HttpSink:
    """Posts batches of events (a JSON list) from a background thread, and an empty heartbeat post every
    `heartbeat_s` from another; never blocks the training loop."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        max_batch: int = POST_MAX_EVENTS,
        flush_interval_s: float = 0.5,
        timeout_s: float = 10.0,
        session: Any = None,
        heartbeat_s: float = HEARTBEAT_SECONDS,
    ) -> None:
        import requests

        self.url = url
        self.token = token if token is not None else ingest_token_from_env()
        self.max_batch, self.flush_interval_s, self.timeout_s = max_batch, flush_interval_s, timeout_s
        self.session = session or requests.Session()
        # requests does not promise a Session is thread-safe: the heartbeat posts through its own.
        self._beat_session = session or requests.Session()
        self.heartbeat_s = heartbeat_s
        self.heartbeats = 0  # accepted heartbeat posts
        self.last_seq = 0
        self.stop_requested = False  # the platform answered 409: the run is over
        self.delivered = 0
        self.dropped = 0
        self._commands: dict[int, ControlCommand] = {}  # staff commands from the replies, by id (controls.py)
        self._buf: list[EventDict] = []
        self._posting = 0  # events taken from the buffer whose post has not ended yet
        self._cond = threading.Condition()
        self._closing = False
        self._deadline = float("inf")
        self._thread = threading.Thread(target=self._run, name="event-post", daemon=True)
        self._thread.start()
        self._beat_stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="event-heartbeat", daemon=True)
        self._beat.start()

    def write(self, event: EventDict) -> None:
        with self._cond:
            self._buf.append(event)
            if len(self._buf) >= self.max_batch:
                self._cond.notify_all()  # the poster, not only a flush() waiting on the same condition

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Post what is buffered now, not at the next interval, and wait up to `timeout_s` until every event
        written so far has been posted (accepted, or refused or given up on as `_send` does); True when none is
        left. A job calls it before taking down what its last events end (trainer/loop.py)."""
        with self._cond:
            self._cond.notify_all()
            return self._cond.wait_for(lambda: not self._buf and not self._posting, timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        self._beat_stop.set()
        with self._cond:
            self._closing = True
            self._deadline = time.monotonic() + timeout_s
            self._cond.notify()
        self._thread.join(timeout_s + 1)
        self._beat.join(min(timeout_s, self.timeout_s) + 1)

    def _heartbeat(self) -> None:
        """Post an empty batch now and every `heartbeat_s` until close; a failed beat is retried until the next."""
        while not self._beat_stop.is_set():
            next_beat = time.monotonic() + self.heartbeat_s
            if self._send(self._beat_session, {"events": []}, 0, until=next_beat):
                self.heartbeats += 1
            self._beat_stop.wait(max(0.0, next_beat - time.monotonic()))

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._buf and not self._closing:
                    self._cond.wait(self.flush_interval_s)
                # Within the platform's caps on one post (trainer/post_packing.py), oldest first.
                cut = next_post(self._buf, max_events=self.max_batch)
                batch, self._buf = self._buf[:cut], self._buf[cut:]
                self._posting = len(batch)
                done = self._closing and not batch and not self._buf
            if done:
                return
            if batch:
                # EventDict is JSON, but a TypedDict is not assignable to requests' JsonType.
                self._send(self.session, cast("list[dict[str, Any]]", batch), len(batch))
                with self._cond:
                    self._posting = 0
                    self._cond.notify_all()

    def _send(self, session: Any, body: Any, count: int, until: float = float("inf")) -> bool:
        """POST `body` (`count` events) until accepted or refused, retrying until `until` (monotonic) or the
        close deadline, whichever is first; True when accepted."""
        import requests

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        delay = 0.2
        while True:
            try:
                resp = session.post(self.url, json=body, headers=headers, timeout=self.timeout_s)
                if resp.status_code < 300:
                    self.delivered += count
                    self._note_commands(resp)
                    return True
                if resp.status_code == 409:
                    self.stop_requested = True
                    self.dropped += count
                    return False
                if resp.status_code < 500:  # our fault: retrying the same bytes cannot help
                    print(f"event post rejected ({resp.status_code}): {resp.text[:300]}", file=sys.stderr)
                    refused = refused_event(resp.status_code, _json(resp), count) if isinstance(body, list) else None
                    if refused is None:
                        self.dropped += count
                        return False
                    # One event refused: only it is lost; the rest are posted again at once.
                    body, count = body[:refused] + body[refused + 1 :], count - 1
                    self.dropped += 1
                    if not count:
                        return False
                    continue
                reason = f"HTTP {resp.status_code}"
            # Read timeouts are retried too: the server may have stored the batch, and a re-post is a no-op.
            except (requests.ConnectionError, requests.Timeout) as exc:
                reason = type(exc).__name__
            if time.monotonic() + delay > min(until, self._deadline):
                if count:
                    print(f"event post gave up at close ({reason}); {count} events lost", file=sys.stderr)
                self.dropped += count
                return False
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _note_commands(self, resp: Any) -> None:
        """Keep the staff commands an ingest reply carries (IngestReply.commands); malformed ones are skipped."""
        reply = _json(resp)
        commands = reply.get("commands") or [] if isinstance(reply, dict) else []
        with self._cond:
            for c in commands if isinstance(commands, list) else []:
                if isinstance(c, dict) and isinstance(c.get("id"), int) and c.get("kind") in CONTROL_KINDS:
                    self._commands.setdefault(
                        c["id"],
                        ControlCommand(
                            id=c["id"],
                            kind=c["kind"],
                            reason=str(c.get("reason", ""))[:500],
                            requested_by=str(c.get("requested_by", ""))[:150],
                        ),
                    )

    def commands(self) -> list[ControlCommand]:
        """Every staff command seen so far, oldest first (the caller remembers which it answered)."""
        with self._cond:
            return [self._commands[k] for k in sorted(self._commands)]


class EventEmitter:
    """Numbers events (`seq` strictly increasing), stamps `ts`, checks the schema, hands them to the sinks."""

    def __init__(self, sinks: list[EventSink], run: str | int | None = None) -> None:
        self.sinks = sinks
        self.run = run
        self.seq = max([getattr(s, "last_seq", 0) for s in sinks] + [0])
        self._lock = threading.Lock()
        self.last_emit = time.monotonic()

    def emit(self, type_: str, data: dict[str, Any]) -> EventDict:
        with self._lock:
            self.seq += 1
            data = data_fit(type_, data)  # an over-long error or message is cut, not a failed run
            event = EventDict(run=self.run, seq=self.seq, ts=time.time(), type=type_, data=data)
            validate_event(event)  # a schema bug fails here, loudly, not in the platform
            undeclared = undeclared_fields(type_, data)
            if undeclared:  # the platform would drop them: declare them in the type's model (trainer/event_schema.py)
                raise EventSchemaError(
                    f"{undeclared[0]}: not declared in trainer/event_schema.py (the platform drops it)"
                )
            for sink in self.sinks:
                sink.write(event)
            self.last_emit = time.monotonic()
            return event

    @property
    def stop_requested(self) -> bool:
        return any(s.stop_requested for s in self.sinks)

    def commands(self) -> list[ControlCommand]:
        """Staff commands delivered to this job so far (only an HTTP sink receives any), oldest first."""
        seen: dict[int, ControlCommand] = {}
        for sink in self.sinks:
            for command in getattr(sink, "commands", lambda: [])():
                seen.setdefault(command["id"], command)
        return [seen[k] for k in sorted(seen)]

    def flush(self, timeout_s: float = 5.0) -> None:
        """Deliver what the sinks buffer (only an HTTP sink does) before going on, waiting up to `timeout_s`."""
        for sink in self.sinks:
            flush = getattr(sink, "flush", None)
            if flush is not None:
                flush(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        for sink in self.sinks:
            sink.close(timeout_s)


def _json(resp: Any) -> Any:
    """A response's JSON body, or None when it has none."""
    try:
        return resp.json()
    except ValueError:
        return None


def sink_for(target: str | None) -> list[EventSink]:
    """`--events` value -> sinks: an http(s) URL posts to the platform, anything else is a JSONL path."""
    if not target:
        return []
    if target.startswith(("http://", "https://")):
        return [HttpSink(target)]
    return [JsonlSink(target)]
