"""The building blocks of every event type's `data` schema (registered in trainer/event_schema.py): the bounds
(characters of a name or a free text, entries of a list or map, the integer range), the bounded field types built
from them (`Name`, `Text`, `Int`, `Count`, `Names`, `Ids`, `Counts`, `Numbers`, `Metrics`, `Spans`), the strict
base every data model extends (`_Data`: no coercion, finite numbers only, undeclared fields ignored) and
`SpanModel`. docs/realtime.md, "Event schema".
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StringConstraints

NAME_MAX = 64  # characters of a name: an engine, worker, node, metric, state, level, reason
TEXT_MAX = 4000  # characters of free text: an error, a log message, a detail, a path
ENGINES_MAX = 32  # engines of a gate event, names in an engine list or a span map (num_engines/workers <= 16)
NODES_MAX = 64  # node ids of a `resources` event (one per bundle, and the driver's)
IDS_MAX = 1024  # group ids (and their epochs) of one rollout batch or train step (prompts_per_step <= 512)
MAP_MAX = 64  # entries of a name -> number map (metrics, dropped-by-filter counts, channel counters)
HISTOGRAMS_MAX = 8
HISTOGRAM_BUCKETS_MAX = 64
PHASES_MAX = 8
URL_MAX = 200  # characters of a `serving` event's URL
# `http://<IPv4 or [IPv6]>:<port>`, nothing else: no name to resolve, no user info, no path, query or fragment.
SERVING_URL_PATTERN = r"^http://(\d{1,3}(\.\d{1,3}){3}|\[[0-9A-Fa-f:.]{2,45}\]):\d{1,5}/?$"
INT_MAX = 2**62  # integers stay well inside a signed 64-bit column and a JSON number

Name = Annotated[str, StringConstraints(max_length=NAME_MAX)]
Text = Annotated[str, StringConstraints(max_length=TEXT_MAX)]
Int = Annotated[int, Field(ge=-INT_MAX, le=INT_MAX)]
Count = Annotated[int, Field(ge=0, le=INT_MAX)]  # how many of something: never negative
Names = Annotated[list[Name], Field(max_length=ENGINES_MAX)]
Ids = Annotated[list[Int], Field(max_length=IDS_MAX)]
Counts = Annotated[dict[Name, Int], Field(max_length=MAP_MAX)]
Numbers = Annotated[dict[Name, float], Field(max_length=MAP_MAX)]


def _metric(value: Any) -> Any:
    """A metric's value: a finite number, true/false, null, or (an eval job's `task`) a name."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and -INT_MAX <= value <= INT_MAX:
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, str) and len(value) <= NAME_MAX:
        return value
    raise ValueError(f"expected a finite number, true/false, null or a string of at most {NAME_MAX} characters")


# The inner type is what the validator lets through (it replaces pydantic's own check): the TypeScript twin of
# the models (runs.telemetry.messages_ts) reads it.
MetricValue = Annotated[int | float | bool | str | None, PlainValidator(_metric)]
Metrics = Annotated[dict[Name, MetricValue], Field(max_length=MAP_MAX)]


class _Data(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, frozen=True)


class SpanModel(_Data):
    start: float
    end: float


Spans = Annotated[dict[Name, SpanModel], Field(max_length=ENGINES_MAX)]
