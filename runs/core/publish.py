"""After-commit publishing of what a write changed (message types: runs/messages.py; formats: docs/realtime.md).

Writers call the *_publish functions inside their transaction; messages go to the channel layer only after
commit (never on rollback): group `run.<id>` gets every stored event, batched per transaction
(`run.events`, sent from the committing thread); group `dashboard` gets board rows of changed runs
(`run.update`) and queue changes (`slots.update`), both from one coalescing daemon thread, so a commit never
pays for the dashboard. What that thread sends is read when it sends, by the `DashboardSender` the app
installs at start-up (runs/telemetry/realtime.py, in runs/apps.py): the readers sit above the writers that call this
module. Publishing never fails the caller: the data is committed and consumers repair gaps from the database.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from runs.messages import RunEventsLayer
from runs.models import RunStatus
from trainer.events import StoredEvent

logger = logging.getLogger(__name__)

DASHBOARD_GROUP = "dashboard"
Move = tuple[int, float]  # a run that joined or left the waiting line, and when that was committed
SLOTS = "slots"  # the coalescer's key of the slots + queue message (run keys are run ids)
_dashboard_pending = threading.local()


class DashboardSender(Protocol):
    """What the dashboard publisher sends, read when it sends (runs/telemetry/realtime.py is the one installed)."""

    def runs_update_send(self, run_ids: Any) -> None: ...

    def slots_update_send(self, *, joined: list[Move], left: list[Move], resync_at: float | None = None) -> None: ...


_sender: DashboardSender | None = None


def dashboard_sender_install(sender: DashboardSender) -> None:
    """Called once by runs/apps.py (RunsConfig.ready): the composition root wires the readers in."""
    global _sender
    _sender = sender


def dashboard_sender() -> DashboardSender:
    if _sender is None:
        raise RuntimeError("no dashboard sender installed: runs/apps.py installs it when Django starts")
    return _sender


def run_group(run_id: int) -> str:
    return f"run.{run_id}"


def group_send_now(group: str, message: Any) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:  # noqa: BLE001 - a lost live update is repaired by replay/resync; never fail the write
        logger.warning("group_send to %s failed", group, exc_info=True)


# --- run stream --------------------------------------------------------------------------------------


class _EventBatch:
    """An on-commit callback carrying the events of one run recorded in one savepoint context."""

    def __init__(self, run_id: int, event: StoredEvent) -> None:
        self.run_id = run_id
        self.events = [event]

    def __call__(self) -> None:
        group_send_now(run_group(self.run_id), RunEventsLayer(type="run.events", events=self.events))


def run_event_publish(event: StoredEvent) -> None:
    """Publish one stored event ({run, seq, ts, type, data}) after commit.

    Consecutive calls for the same run in the same savepoint context join one `run.events` message (a
    batch of 100 events is one publish and one websocket frame); joining only then keeps rollback exact,
    since Django drops a savepoint's callbacks together with its rows.
    """
    conn = transaction.get_connection()
    if not conn.in_atomic_block:
        return _EventBatch(event["run"], event)()
    hooks = conn.run_on_commit
    if hooks:
        sids, func, _robust = hooks[-1]
        if isinstance(func, _EventBatch) and func.run_id == event["run"] and sids == set(conn.savepoint_ids):
            func.events.append(event)
            return
    transaction.on_commit(_EventBatch(event["run"], event))


# --- dashboard ---------------------------------------------------------------------------------------


def _pending() -> dict[str, Any]:
    pending = _dashboard_pending.__dict__
    if not pending:
        pending.update(runs=set(), joined=[], left=[], slots=False, resync=False)
    return pending


def run_changed_publish(*, run_id: int, slots: bool = False) -> None:
    """After commit, send the run's board row to the dashboard (and the slots + queue change if `slots`).

    Changes are collected per thread and handed to the publisher once per commit: rows are read when they
    are sent, so a leftover from a rolled-back transaction only causes a harmless refresh."""
    pending = _pending()
    pending["runs"].add(run_id)
    pending["slots"] = pending["slots"] or slots
    transaction.on_commit(_dashboard_flush)


def run_summary_publish(*, run_id: int) -> None:
    """After commit, refresh the run on the dashboard (coalesced: ingest posts can come 20+ times a second)."""
    transaction.on_commit(lambda: dashboard_publisher().offer(runs={run_id}))


def slots_changed_publish(*, resync: bool = False) -> None:
    """After commit, send slots and the queue change; `resync`: the policy changed, so boards start over."""
    pending = _pending()
    pending["slots"] = True
    pending["resync"] = pending["resync"] or resync
    transaction.on_commit(_dashboard_flush)


def dashboard_publish(update: dict[str, Any]) -> None:
    """Entry point of the lifecycle: {"kind": "run_status", "run": id, "status", "previous", ...} or
    {"kind": "settings"} or {"kind": "cluster"} (Ray's reachability changed: consumers resync, and the new
    snapshot carries it). A move into or out of `queued` is a queue change (`joined` / `left`)."""
    if update.get("kind") != "run_status":
        return slots_changed_publish(resync=update.get("kind") in ("settings", "cluster"))
    status, previous = update.get("status"), update.get("previous")
    if status == RunStatus.QUEUED and previous != RunStatus.QUEUED:
        _pending()["joined"].append(update["run"])
    elif previous == RunStatus.QUEUED and status != RunStatus.QUEUED:
        _pending()["left"].append(update["run"])
    run_changed_publish(run_id=update["run"], slots=True)


def _dashboard_flush() -> None:
    pending = _dashboard_pending.__dict__
    if not pending:
        return
    batch = dict(pending)
    pending.clear()
    at = time.time()  # just after the commit: consumers skip moves older than their snapshot
    if batch["runs"] or batch["slots"]:
        dashboard_publisher().offer(
            runs=batch["runs"],
            joined=[(r, at) for r in batch["joined"]],
            left=[(r, at) for r in batch["left"]],
            slots=batch["slots"],
            resync_at=at if batch["resync"] else None,
        )


class DashboardPublisher:
    """The one dashboard coalescer: a daemon thread that sends each offered run's row, and the slots + queue
    change, each no sooner than `interval` after its previous send. It reads when it sends, so the latest
    state goes out; queue moves offered in between are merged into the next `slots.update`."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.pid = os.getpid()
        self._cond = threading.Condition()
        self._due: dict[Any, float] = {}
        self._last: dict[Any, float] = {}
        self._joined: list[Move] = []
        self._left: list[Move] = []
        self._resync_at: float | None = None
        self._sending = False
        threading.Thread(target=self._loop, name="realtime-dashboard", daemon=True).start()

    def offer(
        self,
        *,
        runs: Iterable[int] = (),
        joined: Iterable[Move] = (),
        left: Iterable[Move] = (),
        slots: bool = False,
        resync_at: float | None = None,
    ) -> None:
        with self._cond:
            keys: list[Any] = list(runs) + ([SLOTS] if slots else [])
            self._joined += joined
            self._left += left
            if resync_at is not None:
                self._resync_at = max(self._resync_at or resync_at, resync_at)
            for key in keys:
                if key not in self._due:
                    self._due[key] = max(time.monotonic(), self._last.get(key, 0.0) + self.interval)
            self._cond.notify_all()

    def discard(self, timeout: float = 10.0) -> bool:
        """Drop what is offered and not yet sent, and wait (up to `timeout`) for a send in progress to end: the
        publisher then touches the database no more until the next offer. Test teardown uses it, so that no send
        of one test reads the database while the next one runs. False: a send outlived the timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._due.clear()
            self._joined, self._left, self._resync_at = [], [], None
            while self._sending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _take_due(self) -> tuple[list[int], tuple[list[Move], list[Move], float | None] | None]:
        with self._cond:
            while True:
                now = time.monotonic()
                ready = [k for k, t in self._due.items() if t <= now]
                if ready:
                    for key in ready:
                        del self._due[key]
                        self._last[key] = now
                    self._sending = True
                    queue = None
                    if SLOTS in ready:
                        queue = (self._joined, self._left, self._resync_at)
                        self._joined, self._left, self._resync_at = [], [], None
                    return [k for k in ready if k != SLOTS], queue
                self._cond.wait(timeout=min(self._due.values()) - now if self._due else None)

    def _loop(self) -> None:
        from django.db import connection

        while True:
            run_ids, queue = self._take_due()
            try:
                sender = dashboard_sender()
                if run_ids:
                    sender.runs_update_send(run_ids)
                if queue is not None:
                    sender.slots_update_send(joined=queue[0], left=queue[1], resync_at=queue[2])
            except Exception:  # noqa: BLE001 - a dashboard refresh must never kill the publisher
                logger.warning("dashboard publish failed", exc_info=True)
            finally:
                connection.close()  # hold no idle connection between bursts (and none at test teardown)
                with self._cond:
                    self._sending = False
                    self._cond.notify_all()


_publisher: DashboardPublisher | None = None
_publisher_lock = threading.Lock()


def dashboard_publisher() -> DashboardPublisher:
    global _publisher
    with _publisher_lock:
        if _publisher is None or _publisher.pid != os.getpid():  # a forked worker needs its own thread
            from django.conf import settings

            _publisher = DashboardPublisher(float(getattr(settings, "REALTIME_COALESCE_SECONDS", 0.1)))
        return _publisher


def dashboard_publisher_discard() -> bool:
    """`DashboardPublisher.discard` on this process's publisher, if it has one (test teardown)."""
    with _publisher_lock:
        publisher = _publisher if _publisher is not None and _publisher.pid == os.getpid() else None
    return publisher.discard() if publisher is not None else True
