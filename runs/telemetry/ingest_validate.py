"""Checking a job's posted batch before anything is stored: its size (bytes per batch: 413; bytes per event,
events per batch: 400), each event against its type's schema (trainer/event_schema.py: undeclared fields are
dropped, a wrong type or an over-long string or list is refused), and the nodes a `resources` event names
(a claim naming a node the platform does not know, no ClusterNode row, is dropped from the event), and the URL
a `serving` event names (dropped unless its host is a Ray node or loopback: runs/execution/serving.py). One refused
event refuses the whole batch, with a 400 naming the event's field (`events[3].data.message`) and its seq.
A job's `status` event comes out typed `job_status` (runs.core.events.stored_type): the stored `status` type is the
platform's moves only. Formats in docs/realtime.md.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.conf import settings

from runs.core.events import stored_type
from runs.errors import InvalidInput, ServiceError
from runs.execution.serving import serving_events_vet
from runs.models import ClusterNode
from trainer.events import EventSchemaError, validate_event

MAX_BATCH = 1000
EVENT_MAX_BYTES = 256 * 1024  # default of settings.INGEST_EVENT_MAX_BYTES
BATCH_MAX_BYTES = 2 * 1024 * 1024  # default of settings.INGEST_MAX_BODY_BYTES (config/limits.py)
log = logging.getLogger(__name__)


class BatchTooLarge(ServiceError):
    """A posted batch over the byte cap: 413 `{"detail", "limit"}` (the cap in bytes)."""

    status_code = 413

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the batch is {size} bytes; at most {limit} bytes per post")
        self.limit = limit

    def as_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {"detail": str(self), "limit": self.limit}


def ingest_limits() -> tuple[int, int]:
    """(bytes per event, bytes per batch) in force."""
    return (
        int(getattr(settings, "INGEST_EVENT_MAX_BYTES", EVENT_MAX_BYTES)),
        int(getattr(settings, "INGEST_MAX_BODY_BYTES", BATCH_MAX_BYTES)),
    )


def ingest_body_check(size: int) -> None:
    """BatchTooLarge when a post's body is over the batch cap (checked before it is parsed)."""
    limit = ingest_limits()[1]
    if size > limit:
        raise BatchTooLarge(size, limit)


def ingest_batch_validate(payload: Any) -> list[dict[str, Any]]:
    """Decode a posted body (a list of events, or {"events": [...]}) into run_events_record items, each event's
    data cut to its declared fields and its type the stored one (`status` -> `job_status`); InvalidInput naming
    the first refused event's field and seq."""
    events = payload.get("events") if isinstance(payload, dict) else payload
    if not isinstance(events, list):
        raise InvalidInput("expected a JSON list of events or an object with a list under 'events'", field="events")
    if len(events) > MAX_BATCH:
        raise InvalidInput(f"at most {MAX_BATCH} events per post, got {len(events)}", field="events")
    event_max = ingest_limits()[0]
    items = []
    for index, raw in enumerate(events):
        size = _bytes(raw)
        if size > event_max:
            raise InvalidInput(f"{_seq(raw)}the event is {size} bytes; at most {event_max}", field=f"events[{index}]")
        try:
            event = validate_event(raw)
        except EventSchemaError as exc:
            where = f"events[{index}]" + ("" if exc.field == "event" else f".{exc.field}")
            raise InvalidInput(f"{_seq(raw)}{exc.reason}", field=where) from None
        items.append({"type": stored_type(event.type), "data": event.data, "ts": event.ts, "source_seq": event.seq})
    _unknown_nodes_dropped(items)
    serving_events_vet(items)
    return items


def _unknown_nodes_dropped(items: list[dict[str, Any]]) -> None:
    """A `resources` event whose `nodes` name a node the platform does not know (a ClusterNode row; one query per
    batch) loses its `nodes`: that placement claim is refused (the slot keeps the granted placement, so a job
    cannot make admission charge made-up nodes), while the event itself, and what it means for the run (ready:
    running), stays. Refusing the whole event would leave the run `starting` when Ray places a bundle on a node
    that joined after the tick's last read."""
    named = {node for item in items if item["type"] == "resources" for node in item["data"].get("nodes") or ()}
    if not named:
        return
    known = set(ClusterNode.objects.filter(node_id__in=named).values_list("node_id", flat=True))
    for item in items:
        unknown = [node for node in item["data"].get("nodes") or () if node not in known]
        if unknown:
            item["data"] = {k: v for k, v in item["data"].items() if k != "nodes"}
            log.warning("run event seq %s: placement on unknown node(s) %s refused", item["source_seq"], unknown[:4])


def _seq(raw: Any) -> str:
    """`event seq N: ` when the event has a usable seq (the message names it), else nothing."""
    seq = raw.get("seq") if isinstance(raw, dict) else None
    return f"event seq {seq}: " if isinstance(seq, int) and not isinstance(seq, bool) and 0 < seq < 2**63 else ""


def _bytes(raw: Any) -> int:
    """The event's size as compact JSON (what it costs to store and send)."""
    try:
        return len(json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode())
    except (ValueError, TypeError, RecursionError):
        return 1 << 62
