"""The one event schema shared by the trainer (emits), the platform (stores, folds) and the browser (draws).

An event is `{run, seq, ts, type, data}`; `seq` is strictly increasing per emitter. The platform renumbers
into its per-run stream (see docs/realtime.md) and keeps the emitter's seq as the idempotency key.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, cast

from trainer.event_fields import HISTOGRAM_BUCKETS_MAX
from trainer.event_schema import DATA_MODELS, DataSchemaError, data_clean, required_keys
from trainer.sample_schema import sample_data_check

EVENT_TYPES: frozenset[str] = frozenset(
    {
        "status",
        "gate",
        "version",
        "sampler",
        "rollout",
        "train",
        "worker",
        "checkpoint",
        "log",
        "resources",
        "sample",
        "control",
        "serving",
        "agents",
    }
)
# Commands staff send a running job (runs/execution/controls.py delivers them in ingest replies; trainer/controls.py
# applies them) and how the job's `control` event says it ended.
CONTROL_KINDS: frozenset[str] = frozenset({"gate_reset"})
CONTROL_OUTCOMES: frozenset[str] = frozenset({"applied", "refused"})
RESOURCE_STATES: frozenset[str] = frozenset({"waiting", "placed", "ready", "timeout"})
GATE_STATES: frozenset[str] = frozenset({"open", "sealed", "draining", "installing", "poisoned"})

# Keys each type's `data` must carry (trainer/event_schema.py declares every field; others are dropped).
# `resources`: the job's placement group (docs/execution.md): waiting -> placed (the group is ready, its processes
# start) -> ready (every process started; the node of every bundle), or waiting -> timeout. `control`: the job's
# answer to a staff command (ControlCommand). `sample`: one captured episode (trainer.sample_schema.SampleData),
# which the platform stores in its own table. `serving`: where the run's session server listens ({url, model}).
# `agents`: per step of a run with an agent environment, its session servers' and workers' counters.
REQUIRED_DATA_KEYS: dict[str, frozenset[str]] = {t: keys for t in DATA_MODELS if (keys := required_keys(t))}


# `train` data may carry `histograms`: {key: HistogramSummary} for these keys (trainer/histograms.py).
HISTOGRAM_KEYS: tuple[str, ...] = ("reward", "advantage", "response_length", "staleness")

SEQ_MAX = 2**63 - 1  # the platform stores seq as a signed 64-bit integer
TS_END = 253402300800.0  # 10000-01-01T00:00:00Z: the first second datetime cannot represent


class HistogramSummary(TypedDict):
    """One distribution of one step: counts[i] samples in [edges[i], edges[i+1]) (the last bucket is closed)."""

    edges: list[float]  # n + 1 increasing finite numbers, 1 <= n <= HISTOGRAM_BUCKETS_MAX
    counts: list[int]  # n non-negative integers


class EventDict(TypedDict, total=False):
    """An event as the trainer posts it (`seq`, `type` required; `data`, `ts`, `run` optional)."""

    seq: int
    type: str
    data: dict[str, Any]
    ts: float
    run: str | int | None


class StoredEvent(TypedDict):
    """An event as the platform stores and streams it: `seq` is the platform's per-run seq (1, 2, 3, ...)."""

    run: int
    seq: int
    ts: float
    type: str
    data: dict[str, Any]


class ControlCommand(TypedDict):
    """A staff command for a running job, as an ingest reply carries it until the job's `control` event
    with the same `id` acknowledges it."""

    id: int
    kind: str  # one of CONTROL_KINDS
    reason: str
    requested_by: str


class IngestReply(TypedDict):
    """The platform's answer to an accepted post (POST /api/runs/<id>/ingest/, docs/realtime.md)."""

    stored: int
    duplicates: int
    last_seq: int
    status: str
    dropped: int
    commands: list[ControlCommand]  # not yet acknowledged, oldest first


class Span(TypedDict):
    """A wall-clock interval in seconds since the epoch (the trace export draws it)."""

    start: float
    end: float


class PublicationPhases(TypedDict):
    """`version.data.phases`: when each stage of the publication of that version ran (seal and drain may run
    before training, in colocated mode)."""

    seal: Span
    drain: Span
    install: Span
    reopen: Span


class RolloutSpans(TypedDict):
    """`rollout.data.spans`: per rollout worker and per engine, from the first kept group's start to the last
    one's end in this batch."""

    workers: dict[str, Span]
    engines: dict[str, Span]


# Optional timing keys, by event type: each is a Span, or (`phases`, `spans`) a mapping of names to Spans.
SPAN_KEYS: dict[str, tuple[str, ...]] = {
    "rollout": ("span",),
    "train": ("span", "eval_span"),
    "checkpoint": ("span",),
}
SPAN_MAP_KEYS: dict[str, tuple[str, ...]] = {"version": ("phases",), "rollout": ("spans.workers", "spans.engines")}


class EventSchemaError(ValueError):
    """An event that does not follow the schema; the message starts with the offending field's path."""

    @property
    def field(self) -> str:
        return str(self).split(": ", 1)[0]

    @property
    def reason(self) -> str:
        return str(self).split(": ", 1)[-1]


@dataclass(frozen=True)
class Event:
    seq: int
    type: str
    data: dict[str, Any] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)
    run: str | int | None = None

    def to_dict(self) -> EventDict:
        return cast(EventDict, asdict(self))


def validate_event(obj: Any) -> Event:
    """Check one decoded JSON event and return it as an Event; raise EventSchemaError naming the field."""
    if not isinstance(obj, dict):
        raise EventSchemaError("event: expected a JSON object")
    seq = obj.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise EventSchemaError("seq: expected a positive integer")
    if seq > SEQ_MAX:
        raise EventSchemaError(f"seq: expected at most {SEQ_MAX} (a signed 64-bit integer)")
    etype = obj.get("type")
    if etype not in EVENT_TYPES:
        raise EventSchemaError(f"type: expected one of {sorted(EVENT_TYPES)}, got {_shown(etype)}")
    data = obj.get("data", {})
    if not isinstance(data, dict):
        raise EventSchemaError("data: expected a JSON object")
    missing = REQUIRED_DATA_KEYS.get(etype, frozenset()) - data.keys()
    if missing:
        raise EventSchemaError(f"data: {etype} event lacks {sorted(missing)}")
    if etype == "control" and (
        not _member(data["kind"], CONTROL_KINDS) or not _member(data["outcome"], CONTROL_OUTCOMES)
    ):
        raise EventSchemaError(
            f"data: control event needs kind in {sorted(CONTROL_KINDS)} and outcome in {sorted(CONTROL_OUTCOMES)}"
        )
    if etype == "control" and (not isinstance(data["id"], int) or isinstance(data["id"], bool)):
        raise EventSchemaError("data.id: expected the integer id of the command")
    if etype == "gate" and not _member(data["state"], GATE_STATES):
        raise EventSchemaError(f"data.state: expected one of {sorted(GATE_STATES)}, got {_shown(data['state'])}")
    if etype == "train" and "histograms" in data:
        validate_histograms(data["histograms"])
    if etype == "sample":
        problem = sample_data_check(data)
        if problem:
            raise EventSchemaError(problem)
    _validate_spans(etype, data)
    try:
        data = data_clean(etype, data)  # types and bounds; undeclared fields dropped
    except DataSchemaError as exc:
        raise EventSchemaError(str(exc)) from None
    ts = obj.get("ts", time.time())
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not 0 <= ts < TS_END:
        # `not 0 <= ts` is also true for NaN; the upper bound keeps datetime (years 1-9999) able to hold it.
        raise EventSchemaError(
            f"ts: expected a number of seconds since the epoch, from 0 to below {TS_END:.0f} (the year 10000)"
        )
    return Event(seq=seq, type=etype, data=data, ts=float(ts), run=obj.get("run"))


def _shown(value: Any) -> str:
    """A posted value in a message, cut short (messages echo no more than 40 characters of input)."""
    text = repr(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__
    return text if len(text) <= 40 else text[:40] + "..."


def _member(value: Any, allowed: frozenset[str]) -> bool:
    return isinstance(value, str) and value in allowed


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate_histograms(obj: Any) -> None:
    """Check a train event's `histograms`; raise EventSchemaError naming the offending field."""
    if not isinstance(obj, dict):
        raise EventSchemaError("data.histograms: expected a JSON object")
    for key, h in obj.items():
        name = f"data.histograms.{key}"
        if key not in HISTOGRAM_KEYS:
            raise EventSchemaError(f"{name}: unknown histogram; expected one of {list(HISTOGRAM_KEYS)}")
        if not isinstance(h, dict) or not isinstance(h.get("edges"), list) or not isinstance(h.get("counts"), list):
            raise EventSchemaError(f"{name}: expected {{edges: [numbers], counts: [integers]}}")
        edges, counts = h["edges"], h["counts"]
        if not 1 <= len(counts) <= HISTOGRAM_BUCKETS_MAX or len(edges) != len(counts) + 1:
            raise EventSchemaError(
                f"{name}: expected 1 to {HISTOGRAM_BUCKETS_MAX} counts and one edge more than counts"
            )
        if not all(_number(e) for e in edges) or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
            raise EventSchemaError(f"{name}.edges: expected strictly increasing finite numbers")
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            raise EventSchemaError(f"{name}.counts: expected non-negative integers")


def _validate_spans(etype: str, data: dict[str, Any]) -> None:
    """The optional timing keys, where present, are Spans (or mappings of names to Spans)."""
    for key in SPAN_KEYS.get(etype, ()):
        if key in data:
            _check_span(data[key], f"data.{key}")
    for path in SPAN_MAP_KEYS.get(etype, ()):
        value: Any = data
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            continue
        if not isinstance(value, dict):
            raise EventSchemaError(f"data.{path}: expected an object of spans")
        for name, span in value.items():
            _check_span(span, f"data.{path}.{name}")


def _check_span(span: Any, where: str) -> None:
    ok = isinstance(span, dict) and all(
        isinstance(span.get(k), (int, float)) and not isinstance(span.get(k), bool) and 0 <= span[k] < TS_END
        for k in ("start", "end")
    )
    if not ok or span["end"] < span["start"]:
        raise EventSchemaError(f"{where}: expected {{start, end}} seconds since the epoch with start <= end")
