"""The one event schema shared by the trainer (emits), the platform (stores, folds) and the browser (draws).

An event is `{run, seq, ts, type, data}`; `seq` is strictly increasing per emitter. The platform renumbers
into its per-run stream (see docs/realtime.md) and keeps the emitter's seq as the idempotency key.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, cast

EVENT_TYPES: frozenset[str] = frozenset(
    {"status", "gate", "version", "sampler", "rollout", "train", "worker", "checkpoint", "log", "resources", "control"}
)
# Commands staff send a running job (runs/controls.py delivers them in ingest replies; trainer/controls.py
# applies them) and how the job's `control` event says it ended.
CONTROL_KINDS: frozenset[str] = frozenset({"gate_reset"})
CONTROL_OUTCOMES: frozenset[str] = frozenset({"applied", "refused"})
RESOURCE_STATES: frozenset[str] = frozenset({"waiting", "ready", "timeout"})
GATE_STATES: frozenset[str] = frozenset({"open", "sealed", "draining", "installing", "poisoned"})

# Keys each type's `data` must carry (more keys are allowed).
REQUIRED_DATA_KEYS: dict[str, frozenset[str]] = {
    "gate": frozenset({"state", "version", "active", "waiting", "engines"}),
    # The job's placement group (docs/execution.md): waiting -> ready (with the node of every bundle) or timeout.
    "resources": frozenset({"state"}),
    # The job's answer to a staff command (ControlCommand): applied, or refused with the reason in `detail`.
    "control": frozenset({"id", "kind", "outcome", "detail"}),
    "version": frozenset({"version", "published_at", "pause_ms"}),
    "sampler": frozenset({"epoch", "group_count", "dataset_size", "consumed_in_epoch"}),
    "train": frozenset({"step", "loss", "reward_mean", "exact_match", "kl", "entropy", "staleness_max"}),
}


SEQ_MAX = 2**63 - 1  # the platform stores seq as a signed 64-bit integer
TS_END = 253402300800.0  # 10000-01-01T00:00:00Z: the first second datetime cannot represent


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


class EventSchemaError(ValueError):
    """An event that does not follow the schema; the message names the offending field."""


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
        raise EventSchemaError(f"type: expected one of {sorted(EVENT_TYPES)}, got {etype!r}")
    data = obj.get("data", {})
    if not isinstance(data, dict):
        raise EventSchemaError("data: expected a JSON object")
    missing = REQUIRED_DATA_KEYS.get(etype, frozenset()) - data.keys()
    if missing:
        raise EventSchemaError(f"data: {etype} event lacks {sorted(missing)}")
    if etype == "control" and (data["kind"] not in CONTROL_KINDS or data["outcome"] not in CONTROL_OUTCOMES):
        raise EventSchemaError(
            f"data: control event needs kind in {sorted(CONTROL_KINDS)} and outcome in {sorted(CONTROL_OUTCOMES)}"
        )
    if etype == "control" and (not isinstance(data["id"], int) or isinstance(data["id"], bool)):
        raise EventSchemaError("data.id: expected the integer id of the command")
    if etype == "gate" and data["state"] not in GATE_STATES:
        raise EventSchemaError(f"data.state: expected one of {sorted(GATE_STATES)}, got {data['state']!r}")
    ts = obj.get("ts", time.time())
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not 0 <= ts < TS_END:
        # `not 0 <= ts` is also true for NaN; the upper bound keeps datetime (years 1-9999) able to hold it.
        raise EventSchemaError(
            f"ts: expected a number of seconds since the epoch, from 0 to below {TS_END:.0f} (the year 10000)"
        )
    return Event(seq=seq, type=etype, data=data, ts=float(ts), run=obj.get("run"))
