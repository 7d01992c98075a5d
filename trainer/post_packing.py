"""How the HTTP sink cuts its buffer into posts the platform accepts, and what it does with one refused event.

The platform caps each ingest post (docs/security.md, "Size limits"): bytes per body (INGEST_MAX_BODY_BYTES,
2 MiB by default), JSON values per body (JSON_MAX_NODES, 50,000) and events per post (1,000). A run that
fell behind (the platform was down for minutes) holds hundreds of events; posted as one body they would be
refused whole, and the sink drops what the platform refuses. So a post takes events, oldest first, while it
stays within POST_MAX_EVENTS, POST_MAX_BYTES and POST_MAX_VALUES, each well under the platform's default cap;
an event alone over a budget still goes, alone (the platform then judges it by its per-event cap).

A post refused for one event (400 naming `events[i]...`, runs/telemetry/ingest_validate.py) loses only that event: the
sink drops it and posts the rest again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

POST_MAX_EVENTS = 200
POST_MAX_BYTES = 512 * 1024
POST_MAX_VALUES = 20_000

_REFUSED_EVENT = re.compile(r"events\[(\d+)\]")


def json_values(value: Any) -> int:
    """Values in a decoded JSON document, containers included (what the platform counts against its cap)."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def next_post(
    events: Sequence[Any],
    *,
    max_events: int = POST_MAX_EVENTS,
    max_bytes: int = POST_MAX_BYTES,
    max_values: int = POST_MAX_VALUES,
) -> int:
    """How many of `events` (oldest first) the next post carries: at least one when there are any."""
    size = values = taken = 0
    for event in events[:max_events]:
        size += len(json.dumps(event, separators=(",", ":"))) + 1
        values += json_values(event)
        if taken and (size > max_bytes or values > max_values):
            break
        taken += 1
    return taken


def refused_event(status: int, body: Any, count: int) -> int | None:
    """The index of the one event a 400 answer refused (its `field` names `events[i]`), else None."""
    if status != 400 or not isinstance(body, dict):
        return None
    match = _REFUSED_EVENT.match(str(body.get("field") or ""))
    index = int(match.group(1)) if match else -1
    return index if 0 <= index < count else None
