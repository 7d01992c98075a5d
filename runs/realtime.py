"""Real-time fan-out and the reads behind the websocket snapshots (formats: docs/realtime.md).

Writers call the *_publish functions inside their transaction; messages go to the channel layer only after
commit (never on rollback): group `run.<id>` gets every stored event, batched per transaction
(`run.events`); group `dashboard` gets the run's current JSON (`run.update`) and the slots + queue
(`slots.update`). Publishing never fails the caller: the data is committed and consumers repair gaps from
the database.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from runs.models import ACTIVE_STATUSES, Run, RunEvent, RunStatus

logger = logging.getLogger(__name__)

DASHBOARD_GROUP = "dashboard"
_dashboard_pending = threading.local()


def run_group(run_id: int) -> str:
    return f"run.{run_id}"


def group_send_now(group: str, message: dict[str, Any]) -> None:
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

    def __init__(self, run_id: int, event: dict[str, Any]) -> None:
        self.run_id = run_id
        self.events = [event]

    def __call__(self) -> None:
        group_send_now(run_group(self.run_id), {"type": "run.events", "events": self.events})


def run_event_publish(event: dict[str, Any]) -> None:
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

def run_changed_publish(*, run_id: int, slots: bool = False) -> None:
    """After commit, send the run's current JSON to the dashboard (and the slots + queue if `slots`).

    Changes are collected per thread and sent once per commit: they are state reads, not deltas, so a
    leftover from a rolled-back transaction only causes a harmless refresh with the next commit.
    """
    pending = _dashboard_pending.__dict__
    pending.setdefault("runs", set()).add(run_id)
    pending["slots"] = pending.get("slots", False) or slots
    transaction.on_commit(_dashboard_flush)


def run_summary_publish(*, run_id: int) -> None:
    """After commit, refresh the run on the dashboard, at most once per REALTIME_COALESCE_SECONDS per run and
    off the request path (ingest posts can come 20+ times a second; the browser needs ~10 updates/s)."""
    transaction.on_commit(lambda: _summary_publisher().offer(run_id))


class _SummaryPublisher:
    """A daemon thread that sends `run.update` for offered runs, each no sooner than `interval` after its
    previous one; it reads the run when sending, so the latest state is what goes out."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.pid = os.getpid()
        self._cond = threading.Condition()
        self._due: dict[int, float] = {}
        self._last: dict[int, float] = {}
        threading.Thread(target=self._loop, name="realtime-summary", daemon=True).start()

    def offer(self, run_id: int) -> None:
        with self._cond:
            if run_id not in self._due:
                self._due[run_id] = max(time.monotonic(), self._last.get(run_id, 0.0) + self.interval)
                self._cond.notify()

    def _take_due(self) -> list[int]:
        with self._cond:
            while True:
                now = time.monotonic()
                ready = [r for r, t in self._due.items() if t <= now]
                if ready:
                    for run_id in ready:
                        del self._due[run_id]
                        self._last[run_id] = now
                    return ready
                self._cond.wait(timeout=min(self._due.values()) - now if self._due else None)

    def _loop(self) -> None:
        from django.db import connection

        while True:
            run_ids = self._take_due()
            try:
                runs_update_send(run_ids)
            except Exception:  # noqa: BLE001 - a dashboard refresh must never kill the publisher
                logger.warning("dashboard summary publish failed", exc_info=True)
            finally:
                connection.close()  # hold no idle connection between bursts (and none at test teardown)


_publisher: _SummaryPublisher | None = None
_publisher_lock = threading.Lock()


def _summary_publisher() -> _SummaryPublisher:
    global _publisher
    with _publisher_lock:
        if _publisher is None or _publisher.pid != os.getpid():  # a forked worker needs its own thread
            from django.conf import settings

            _publisher = _SummaryPublisher(float(getattr(settings, "REALTIME_COALESCE_SECONDS", 0.1)))
        return _publisher


def slots_changed_publish() -> None:
    _dashboard_pending.__dict__["slots"] = True
    _dashboard_pending.__dict__.setdefault("runs", set())
    transaction.on_commit(_dashboard_flush)


def dashboard_publish(update: dict[str, Any]) -> None:
    """Entry point of runs.services: {"kind": "run_status", "run": id, ...} or {"kind": "settings"}."""
    if update.get("kind") == "run_status":
        run_changed_publish(run_id=update["run"], slots=True)
    else:
        slots_changed_publish()


def _dashboard_flush() -> None:
    pending = _dashboard_pending.__dict__
    run_ids, slots = pending.pop("runs", set()), pending.pop("slots", False)
    if not run_ids and not slots:
        return
    try:
        if run_ids:
            runs_update_send(run_ids)
        if slots:
            group_send_now(DASHBOARD_GROUP, {"type": "slots.update", **slots_and_queue()})
    except Exception:  # noqa: BLE001 - same rule as group_send_now: the write already committed
        logger.warning("dashboard publish failed", exc_info=True)


def runs_update_send(run_ids: Any) -> None:
    """Read the runs now and send each to the dashboard; `last_seq` lets consumers drop stale reads."""
    runs = list(Run.objects.select_related("owner").filter(pk__in=run_ids))
    for run, payload in zip(runs, runs_payload(runs)):
        group_send_now(DASHBOARD_GROUP,
                       {"type": "run.update", "run": payload, "owner_id": run.owner_id, "last_seq": run.last_seq})


# --- reads for snapshots -----------------------------------------------------------------------------

def runs_payload(runs: list[Run]) -> list[dict[str, Any]]:
    """REST run JSON (the same serializer as GET /api/runs/), queue info included for queued runs."""
    from runs import selectors
    from runs.api.serializers import RunSerializer  # late: the API layer imports this module's callers

    info = selectors.runs_queue_info(runs=runs)
    return list(RunSerializer(runs, many=True, context={"queue_info": info}).data)


@dataclass(frozen=True)
class StreamOpening:
    """What a /ws/runs/<id>/ connection starts with, or why it is refused."""

    refusal: str | None  # "not_found" | "forbidden" | "after_beyond" | None
    snapshot: dict[str, Any] | None = None  # the run JSON, summary folded up to last_seq (one row read)
    last_seq: int = 0
    replay: list[dict[str, Any]] = field(default_factory=list)  # first page of events after `replay_from`
    replay_from: int = 0  # replay starts after this seq: `after`, or later when more than replay_max are behind


def run_stream_open(*, run_id: int, user: Any, after: int | None, limit: int,
                    replay_max: int | None = None) -> StreamOpening:
    """Permission check (owner or staff), snapshot and the first replay page, in one database session.
    With `replay_max`, the replay covers at most the newest `replay_max` events (`replay_from` says where)."""
    run = Run.objects.select_related("owner").filter(pk=run_id).first()
    if run is None:
        return StreamOpening(refusal="not_found")
    if not (user.is_staff or run.owner_id == user.pk):
        return StreamOpening(refusal="forbidden")
    if after is not None and after > run.last_seq:
        return StreamOpening(refusal="after_beyond")
    start = after or 0
    if after is not None and replay_max is not None:
        start = max(after, run.last_seq - replay_max)
    replay = run_events_after(run_id=run_id, after=start, limit=limit) if after is not None else []
    return StreamOpening(refusal=None, snapshot=runs_payload([run])[0], last_seq=run.last_seq, replay=replay,
                         replay_from=start)


def runs_last_seq(*, run_ids: list[int]) -> dict[int, int]:
    return dict(Run.objects.filter(pk__in=run_ids).values_list("pk", "last_seq"))


def run_events_after(*, run_id: int, after: int, limit: int) -> list[dict[str, Any]]:
    from runs.events import run_event_to_dict

    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:limit]
    return [run_event_to_dict(row) for row in rows]


def slots_and_queue() -> dict[str, Any]:
    """{slots, queue: [{run, owner_id}]}: queued runs in grant order (their `position.overall`)."""
    from runs import selectors

    queued = list(Run.objects.select_related("owner").filter(status=RunStatus.QUEUED).order_by("created_at", "id"))
    queue = [{"run": p, "owner_id": r.owner_id, "last_seq": r.last_seq} for r, p in zip(queued, runs_payload(queued))]
    queue.sort(key=lambda item: (item["run"]["position"] or {}).get("overall", 1 << 30))
    return {"slots": selectors.slots_snapshot(), "queue": queue}


def dashboard_snapshot(*, user: Any) -> tuple[dict[str, Any], dict[int, int]]:
    """{slots, queue, active} as this user may see them (own runs; staff: all), and each shown run's last seq."""
    state = slots_and_queue()
    active = Run.objects.select_related("owner").filter(status__in=ACTIVE_STATUSES).order_by("id")
    if not user.is_staff:
        active = active.filter(owner_id=user.pk)
    visible = [item for item in state["queue"] if user.is_staff or item["owner_id"] == user.pk]
    active = list(active)
    seqs = {item["run"]["id"]: item["last_seq"] for item in visible} | {run.pk: run.last_seq for run in active}
    snapshot = {"slots": state["slots"], "queue": [item["run"] for item in visible], "active": runs_payload(active)}
    return snapshot, seqs
