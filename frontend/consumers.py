"""Websocket consumers: one run's exact event stream (`/ws/runs/<id>/`) and the dashboard (`/ws/dashboard/`).

Each authenticates, checks permission, joins its group, sends a snapshot, then forwards live messages; the
message types are runs/messages.py, the no-gap/no-duplicate rules docs/realtime.md. Reads go through
runs.selectors and runs.telemetry.dashboard; the dashboard's rate limit is the publisher's (runs.core.publish), not
ours.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.conf import settings

from frontend import ws_guard
from frontend.ws_guard import (
    CLOSE_BAD_REQUEST,
    CLOSE_FORBIDDEN,
    CLOSE_UNAUTHENTICATED,
    AuthenticatedConsumer,
)
from runs import selectors
from runs.core import publish
from runs.core.visibility import may_see
from runs.messages import (
    DashboardRunMsg,
    DashboardSlotsMsg,
    EventsMsg,
    RunEventsLayer,
    RunSnapshotMsg,
    RunUpdateLayer,
    SlotsUpdateLayer,
    TruncatedMsg,
)
from runs.telemetry import dashboard

logger = logging.getLogger(__name__)
REPLAY_PAGE = 500


def replay_max() -> int:
    """Most stored events one connect replays; older ones are for GET /api/runs/<id>/events/."""
    return max(1, int(getattr(settings, "WS_REPLAY_MAX", 2000)))


def resync_seconds() -> float:
    return float(getattr(settings, "REALTIME_RESYNC_SECONDS", 2.0))


class RunConsumer(AuthenticatedConsumer):
    """Every event of one run, in platform seq order, exactly once per connection (docs/realtime.md)."""

    run_id: int
    last_sent: int = 0
    group: str | None = None
    streaming = False  # set once the snapshot is out; live messages before that belong to a refused socket

    async def connect(self) -> None:
        self._lock = asyncio.Lock()
        user = self.user_or_none()
        if user is None:
            return await self.refuse(CLOSE_UNAUTHENTICATED)
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        after = self._after_from_query()
        if after == -1:
            return await self.refuse(CLOSE_BAD_REQUEST)
        if not await self.guard_start(user):
            return
        # Subscribe BEFORE reading the database: an event committed after our read is then certain to
        # reach us live. Channels dispatches one message at a time, so live messages wait in our queue
        # until connect() returns, and run_events drops those the replay already covered. (Subscribing
        # before the permission check is harmless: a refused socket forwards nothing and leaves the group.)
        self.group = publish.run_group(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        # One database call (one connection) for check, snapshot and first replay page: connects are bursty.
        opening = await database_sync_to_async(selectors.run_stream_open)(
            run_id=self.run_id, user=user, after=after, limit=REPLAY_PAGE, replay_max=replay_max()
        )
        if opening.refusal is not None:
            return await self.refuse(REFUSAL_CODES[opening.refusal])
        self._last_live = time.monotonic()
        await self.accept()
        assert opening.snapshot is not None
        await self.send_json(RunSnapshotMsg(type="snapshot", run=opening.snapshot, last_seq=opening.last_seq))
        self.last_sent = opening.last_seq if after is None else after
        if after is not None and opening.replay_from > after:
            # Paged replay: at most WS_REPLAY_MAX events on connect; the client reads older ones from
            # GET /api/runs/<id>/events/?after=<after> (paged) if it wants them.
            await self.send_json(TruncatedMsg(type="truncated", after=after, through=opening.replay_from))
            self.last_sent = opening.replay_from
        if opening.replay:
            await self.send_json(EventsMsg(type="events", events=opening.replay))
            self.last_sent = opening.replay[-1]["seq"]
        await self._send_stored(upto=opening.last_seq)
        self.streaming = True
        stream_watch.add(self)

    def _after_from_query(self) -> int | None:
        """None when absent, -1 when malformed, else the client's last processed seq."""
        query = self.scope.get("query_string", b"").decode("utf-8", errors="replace")
        values = parse_qs(query).get("after")
        if not values:
            return None
        raw = values[-1]
        # ASCII digits only (int() takes "١٢" too), and no more than fit a 64-bit seq, like the REST ?after=.
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
            return -1
        return int(raw)

    async def _send_stored(self, upto: int | None = None) -> None:
        """Send stored events after last_sent (up to `upto`) in pages; caller holds the order."""
        while upto is None or self.last_sent < upto:
            page = await database_sync_to_async(selectors.run_events_after)(
                run_id=self.run_id, after=self.last_sent, limit=REPLAY_PAGE
            )
            if not page:
                return
            await self.send_json(EventsMsg(type="events", events=page))
            self.last_sent = page[-1]["seq"]
            if len(page) < REPLAY_PAGE:
                return

    async def run_events(self, message: RunEventsLayer) -> None:
        """Layer message from runs.core.publish: a committed batch, seqs contiguous and ascending."""
        if not self.streaming:
            return
        self._last_live = time.monotonic()
        async with self._lock:
            events = [e for e in message["events"] if e["seq"] > self.last_sent and e["run"] == self.run_id]
            if not events:
                return
            if events[0]["seq"] != self.last_sent + 1:
                # A message went missing (Redis restart) or two publishers overtook each other. Everything
                # up to these seqs is committed (seqs are assigned under the run's row lock), so the
                # database, not this message, fills the gap.
                await self._send_stored(upto=events[-1]["seq"])
                return
            await self.send_json(EventsMsg(type="events", events=events))
            self.last_sent = events[-1]["seq"]

    async def catch_up(self, last_seq: int, idle_for: float) -> None:
        """Called by stream_watch: send what the database has beyond last_sent if no live message came for
        `idle_for` seconds (the tail of a stream published while the layer could not deliver it)."""
        if self.streaming and last_seq > self.last_sent and time.monotonic() - self._last_live >= idle_for:
            async with self._lock:
                await self._send_stored(upto=last_seq)

    async def rights_check(self, user: Any) -> None:
        self.user = user
        if not await database_sync_to_async(ws_guard.run_visible)(user, self.run_id):
            await self.end(CLOSE_FORBIDDEN)

    async def disconnect(self, code: int) -> None:
        self.ended = True
        stream_watch.discard(self)
        await self._guard_stop()
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)


class StreamWatch:
    """One task per process: every REALTIME_RESYNC_SECONDS, read the last seq of each run streamed here (one
    query for all) and let idle consumers that are behind catch up from the database."""

    def __init__(self) -> None:
        self.consumers: dict[int, set[RunConsumer]] = {}
        self._task: asyncio.Task | None = None
        self._pending: set[asyncio.Task] = set()

    def add(self, consumer: RunConsumer) -> None:
        self.consumers.setdefault(consumer.run_id, set()).add(consumer)
        # One task per event loop (daphne has one; tests start a loop per scenario).
        if self._task is None or self._task.done() or self._task.get_loop() is not asyncio.get_running_loop():
            self._task = asyncio.create_task(self._loop())

    def discard(self, consumer: RunConsumer) -> None:
        local = self.consumers.get(getattr(consumer, "run_id", -1))
        if local is not None:
            local.discard(consumer)
            if not local:
                del self.consumers[consumer.run_id]

    async def _loop(self) -> None:
        while self.consumers:
            interval = resync_seconds()
            await asyncio.sleep(interval)
            try:
                seqs = await database_sync_to_async(selectors.runs_last_seq)(run_ids=list(self.consumers))
            except Exception:  # noqa: BLE001 - the database may be briefly away; try again next round
                logger.warning("stream watch could not read last seqs", exc_info=True)
                continue
            for run_id, last_seq in seqs.items():
                for consumer in list(self.consumers.get(run_id, ())):
                    task = asyncio.create_task(consumer.catch_up(last_seq, interval))
                    self._pending.add(task)  # the loop keeps only weak references to tasks
                    task.add_done_callback(self._pending.discard)


stream_watch = StreamWatch()
# Any run the asker may not see closes 4403, whether it is another user's or missing (issue 27): one code for
# both, so a socket still does not reveal which run ids exist. A socket already streaming whose user loses the
# right gets 4403 too.
REFUSAL_CODES = {"not_found": CLOSE_FORBIDDEN, "forbidden": CLOSE_FORBIDDEN, "after_beyond": CLOSE_BAD_REQUEST}


class DashboardConsumer(AuthenticatedConsumer):
    """Slots, queue changes and run rows; non-staff users only see their own runs. Messages come coalesced
    from runs.core.publish's publisher (at most one per run, and one slots message, per 100 ms per process)."""

    joined = False

    async def connect(self) -> None:
        user = self.user_or_none()
        if user is None:
            return await self.refuse(CLOSE_UNAUTHENTICATED)
        if not await self.guard_start(user):
            return
        await self.channel_layer.group_add(publish.DASHBOARD_GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        await self._send_snapshot()

    async def _send_snapshot(self) -> None:
        self._snapshot_at = time.time()  # queue moves committed before this are in the snapshot
        snapshot, self._run_seqs = await database_sync_to_async(dashboard.dashboard_snapshot)(user=self.user)
        await self.send_json(snapshot)

    def _visible(self, owner_id: int) -> bool:
        return may_see(self.user, owner_id)

    async def run_update(self, message: RunUpdateLayer) -> None:
        if not self._visible(message["owner_id"]):
            return
        run_id, seq = message["run"]["id"], message["last_seq"]
        # Updates are state reads: one read before our snapshot may arrive after it. The run's last seq
        # only grows, so an update older than what the browser has is dropped.
        if seq < self._run_seqs.get(run_id, 0):
            return
        self._run_seqs[run_id] = seq
        await self.send_json(DashboardRunMsg(type="run", run=message["run"]))

    async def slots_update(self, message: SlotsUpdateLayer) -> None:
        resync_at = message.get("resync_at")
        if resync_at is not None and resync_at > self._snapshot_at:
            # The policy changed after our snapshot: positions and reasons start over from a new one. A change
            # our snapshot already shows (the publisher merged it with later moves) is not a reason to.
            return await self._send_snapshot()
        queue = dict(message["queue"])
        for side in ("joined", "left"):
            queue[side] = [key for key in message["queue"][side] if key["at"] > self._snapshot_at]
        await self.send_json(DashboardSlotsMsg(type="slots", slots=message["slots"], queue=queue))  # type: ignore[typeddict-item]

    async def rights_check(self, user: Any) -> None:
        # Staff lost (or gained): what this socket already sent was cut for other rights. Close; the board
        # reconnects and gets a snapshot for the rights the user has now.
        if bool(user.is_staff) != bool(self.user.is_staff):
            await self.end(CLOSE_FORBIDDEN)
        self.user = user

    async def disconnect(self, code: int) -> None:
        self.ended = True
        await self._guard_stop()
        if self.joined:
            await self.channel_layer.group_discard(publish.DASHBOARD_GROUP, self.channel_name)
