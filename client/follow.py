"""Following a run live over its websocket (docs/realtime.md): every event exactly once, in seq order, across
reconnects. Each connection takes a fresh one-use ticket (POST /api/ws-ticket/) and resumes with
`?after=<last seq>`; events the server announces as truncated, or a gap, are read from the REST history."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import connect

from client.errors import ApiError, ConnectionFailed

if TYPE_CHECKING:
    from client.api import Client
    from client.types import Event

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
FINAL_CLOSE = {4400, 4401, 4403, 4404}  # the server's refusals: reconnecting cannot help (4404: older servers)
RECONNECTS_MAX = 10  # consecutive failed connections before giving up
MESSAGE_MAX = 16 * 2**20


def follow_events(api: Client, run_id: int, *, after: int | None, stop_at_end: bool) -> Iterator[Event]:
    last = after  # the highest seq yielded; None: live only, from the snapshot's last seq
    failures = 0
    base = "ws" + api.url.removeprefix("http")  # http -> ws, https -> wss
    while True:
        query = f"ticket={api.ws_ticket()}" + (f"&after={last}" if last is not None else "")
        try:
            with connect(f"{base}/ws/runs/{run_id}/?{query}", open_timeout=30, max_size=MESSAGE_MAX) as socket:
                for raw in socket:
                    failures = 0
                    message: dict[str, Any] = json.loads(raw)
                    if message["type"] == "snapshot":
                        last = message["last_seq"] if last is None else last
                        if stop_at_end and message["run"]["status"] in TERMINAL and last >= message["last_seq"]:
                            return
                        continue
                    if message["type"] == "truncated":
                        events = list(_history(api, run_id, after=last or 0, through=message["through"]))
                    elif message["type"] == "events":
                        events = message["events"]
                    else:
                        continue
                    for event in events:
                        if last is not None and event["seq"] <= last:
                            continue  # already yielded (a replay overlapping what we had)
                        if last is not None and event["seq"] > last + 1:  # a gap: read it first
                            for missed in _history(api, run_id, after=last, through=event["seq"] - 1):
                                yield missed
                                last = missed["seq"]
                        yield event
                        last = event["seq"]
                        if stop_at_end and _ends(event):
                            return
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            if code in FINAL_CLOSE:
                raise ApiError(code, {"detail": f"the run's websocket was closed with {code}"}) from exc
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
            failures += 1
            if failures > RECONNECTS_MAX:
                raise ConnectionFailed(f"{base}/ws/runs/{run_id}/: {exc}") from exc
        time.sleep(min(0.2 * 2**failures, 5.0))


def _ends(event: Event) -> bool:
    return event["type"] == "status" and event["data"].get("status") in TERMINAL


def _history(api: Client, run_id: int, *, after: int, through: int) -> Iterator[Event]:
    for event in api.events(run_id, after=after):
        if event["seq"] > through:
            return
        yield event
