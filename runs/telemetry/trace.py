"""Trace export: a run's stored events as Chrome trace JSON (the Trace Event Format that Perfetto and
chrome://tracing open), one track per part of the run.

Tracks (threads of one process, the run): `driver` (rollout batches; the platform's moves, `status X`, and the
job's reports of its state, `job X`), `learner` (train steps, evaluations, checkpoints), `gate` (each
publication: seal, drain, install, reopen, inside one `publish vN` span; gate states as instants), `startup`
(where the time before training went: queued, launch, placement, process start), one per engine and one per
rollout worker (the span of the groups each served in a batch).
Spans come from the timing keys the trainer posts (trainer/events.py: `span`, `spans`, `phases`); events
stored without them (older jobs) add only instants. Times are microseconds since the run's first
stored event (`otherData.epoch_start_s`). docs/observability.md, section "Trace export".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import JSONField
from django.db.models.expressions import RawSQL

from runs.core.events import JOB_STATUS, STATUS
from runs.models import Run, RunEvent
from trainer.event_fields import NAME_MAX

# Fixed track ids; engines and workers get ids from these bases in name order.
DRIVER, LEARNER, GATE, STARTUP = 1, 2, 3, 4
ENGINE_BASE, WORKER_BASE = 100, 10_000
PUBLICATION_PHASES = ("seal", "drain", "install", "reopen")
# Bounds: a job names its engines and workers, and a run may hold EVENTS_MAX_PER_RUN events. A trace reads the
# run's latest TRACE_READ_MAX events of the traced types (older ones are left out: `otherData.truncated`) and
# draws at most MAX_TRACE_EVENTS, so its time and memory are bounded whatever the job posted (docs/observability.md).
MAX_TRACKS_PER_KIND = 256
MAX_TRACE_EVENTS = 50_000
TRACE_READ_MAX = 5_000
# The data keys tracks draw: on PostgreSQL only these leave the database (older rows may hold anything).
_DRAWN_KEYS: tuple[str, ...] = ("status", "state", "step", "span", "eval_span", "spans", "loss")
_DRAWN_KEYS += ("version", "active", "phases", "pause_ms")
_DATA = '"runs_runevent"."data"'
_PAIRS = ", ".join(f"'{key}', {_DATA} -> '{key}'" for key in _DRAWN_KEYS)  # literals of this module, not input
_DRAWN_SQL = f"jsonb_strip_nulls(jsonb_build_object({_PAIRS}))"  # absent and null read the same
TRACE_TYPES = (STATUS, JOB_STATUS, "rollout", "train", "version", "gate", "checkpoint", "resources")
# The startup phase each platform move or `resources` state begins (docs/execution.md); any of them ends the one
# before.
STARTUP_BEGINS = {"queued": "queued", "starting": "launch", "waiting": "placement", "placed": "process start"}


class TraceBuilder:
    """Collects trace events; `track` names each thread once, in the order tracks are first used."""

    def __init__(self, run: Run, t0: float) -> None:
        self.run, self.t0 = run, t0
        self.events: list[dict[str, Any]] = []
        self.tracks: dict[int, str] = {}
        self._named: dict[tuple[int, str], int] = {}
        self.truncated = False
        self.phase: tuple[str, float] | None = None  # the startup phase under way and when it began

    def startup(self, seq: int, ts: float, state: Any) -> None:
        """A status or `resources` state at `ts`: it ends the startup phase under way (a span) and may begin one."""
        if self.phase is not None:
            name, start = self.phase
            self.span(self.track(STARTUP, "startup"), name, "startup", {"start": start, "end": ts}, {"seq": seq})
        begins = STARTUP_BEGINS.get(state) if isinstance(state, str) else None
        self.phase = (begins, ts) if begins else None

    def track(self, base: int, name: str) -> int:
        """The id of track `name` (made on first use); past MAX_TRACKS_PER_KIND names of a kind, one `other`."""
        if base in (DRIVER, LEARNER, GATE):
            self.tracks.setdefault(base, name)
            return base
        key = (base, name)
        if key not in self._named:
            used = sum(1 for b, _ in self._named if b == base)
            if used >= MAX_TRACKS_PER_KIND:
                key = (base, "other")
                if key in self._named:
                    return self._named[key]
            self._named[key] = base + used
            self.tracks[self._named[key]] = key[1]
        return self._named[key]

    def _append(self, event: dict[str, Any]) -> None:
        if len(self.events) >= MAX_TRACE_EVENTS:
            self.truncated = True
            return
        self.events.append(event)

    def us(self, seconds: float) -> float:
        return round((seconds - self.t0) * 1e6, 1)

    def span(self, tid: int, name: str, cat: str, span: Any, args: dict[str, Any] | None = None) -> None:
        if not _is_span(span):
            return
        start, end = float(span["start"]), float(span["end"])
        self._append(
            {
                "name": name,
                "cat": cat,
                "ph": "X",
                "ts": self.us(start),
                "dur": round(max(0.0, end - start) * 1e6, 1),
                "pid": self.run.pk,
                "tid": tid,
                "args": args or {},
            }
        )

    def instant(self, tid: int, name: str, cat: str, ts: float, args: dict[str, Any]) -> None:
        self._append(
            {
                "name": name,
                "cat": cat,
                "ph": "i",
                "s": "t",
                "ts": self.us(ts),
                "pid": self.run.pk,
                "tid": tid,
                "args": args,
            }
        )

    def metadata(self) -> list[dict[str, Any]]:
        pid = self.run.pk
        out: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"run {pid}: {self.run.name}"}}
        ]
        for tid, name in sorted(self.tracks.items()):
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
            out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        return out


def run_trace(*, run: Run) -> dict[str, Any]:
    """The Chrome trace JSON of a run, from its latest TRACE_READ_MAX stored events in seq order (streamed)."""
    traced = RunEvent.objects.filter(run_id=run.pk, type__in=TRACE_TYPES)
    first = traced.order_by("-seq").values_list("seq", flat=True)[TRACE_READ_MAX : TRACE_READ_MAX + 1].first()
    rows = traced.filter(seq__gt=first) if first is not None else traced
    picked: Iterator[tuple[int, datetime, str, Any]]
    if connection.vendor == "postgresql":
        drawn = rows.annotate(drawn=RawSQL(_DRAWN_SQL, [], output_field=JSONField()))
        picked = drawn.order_by("seq").values_list("seq", "ts", "type", "drawn").iterator(chunk_size=2000)
    else:
        picked = rows.order_by("seq").values_list("seq", "ts", "type", "data").iterator(chunk_size=2000)
    trace = trace_from_events(run, ((seq, ts.timestamp(), etype, data) for seq, ts, etype, data in picked))
    trace["otherData"]["truncated"] = trace["otherData"]["truncated"] or first is not None
    return trace


def trace_from_events(run: Run, events: Iterable[tuple[int, float, str, Any]]) -> dict[str, Any]:
    """The trace of (seq, ts seconds, type, data) events in seq order."""
    builder: TraceBuilder | None = None
    for seq, ts, etype, data in events:
        if builder is None:
            builder = TraceBuilder(run, ts)
        if isinstance(data, dict):
            _add(builder, seq, ts, etype, data)
    builder = builder or TraceBuilder(run, run.created_at.timestamp())
    return {
        "traceEvents": builder.metadata() + builder.events,
        "displayTimeUnit": "ms",
        "otherData": {"run": run.pk, "name": run.name, "epoch_start_s": builder.t0, "truncated": builder.truncated},
    }


def _add(b: TraceBuilder, seq: int, ts: float, etype: str, data: dict[str, Any]) -> None:
    """The trace events of one stored event; only declared fields are read, each as a number or a short name."""
    step = _num(data.get("step"))
    if etype == STATUS:  # the platform's moves
        b.instant(b.track(DRIVER, "driver"), f"status {_name(data.get('status'))}", "status", ts, {"seq": seq})
        b.startup(seq, ts, data.get("status"))
    elif etype == JOB_STATUS:  # the job's own reports of its state
        b.instant(b.track(DRIVER, "driver"), f"job {_name(data.get('status'))}", "status", ts, {"seq": seq})
    elif etype == "resources":
        b.startup(seq, ts, data.get("state"))
    elif etype == "rollout":
        b.span(b.track(DRIVER, "driver"), f"rollout step {step}", "generation", data.get("span"), {"seq": seq})
        spans = _dict(data.get("spans"))
        for kind, base in (("engines", ENGINE_BASE), ("workers", WORKER_BASE)):
            for name, span in sorted(_dict(spans.get(kind)).items()):
                b.span(b.track(base, str(name)[:64]), f"generate step {step}", "generation", span, {"seq": seq})
    elif etype == "train":
        learner = b.track(LEARNER, "learner")
        b.span(
            learner, f"train step {step}", "training", data.get("span"), {"seq": seq, "loss": _num(data.get("loss"))}
        )
        b.span(learner, f"eval step {step}", "eval", data.get("eval_span"), {"seq": seq})
    elif etype == "checkpoint":
        b.span(b.track(LEARNER, "learner"), f"checkpoint step {step}", "checkpoint", data.get("span"), {"seq": seq})
    elif etype == "version":
        _publication(b, seq, data)
    elif etype == "gate":
        args = {"seq": seq, "version": _num(data.get("version")), "active": _num(data.get("active"))}
        b.instant(b.track(GATE, "gate"), f"gate {_name(data.get('state'))}", "gate", ts, args)


def _publication(b: TraceBuilder, seq: int, data: dict[str, Any]) -> None:
    """`publish vN` from the first stage's start to the last stage's end, each stage inside it."""
    phases = _dict(data.get("phases"))
    spans = [(name, phases[name]) for name in PUBLICATION_PHASES if _is_span(phases.get(name))]
    if not spans:
        return
    gate, version = b.track(GATE, "gate"), _num(data.get("version"))
    whole = {"start": min(s["start"] for _, s in spans), "end": max(s["end"] for _, s in spans)}
    b.span(
        gate,
        f"publish v{version}",
        "publication",
        whole,
        {"seq": seq, "version": version, "pause_ms": _num(data.get("pause_ms"))},
    )
    for name, span in spans:
        b.span(gate, f"{name} v{version}", "publication", span, {"seq": seq, "version": version})


def _num(value: Any) -> float | int | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return value if ok else None


def _name(value: Any) -> str:
    return str(value)[:NAME_MAX] if isinstance(value, (str, int, float)) or value is None else "?"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _is_span(span: Any) -> bool:
    return (
        isinstance(span, dict)
        and all(isinstance(span.get(k), (int, float)) and not isinstance(span.get(k), bool) for k in ("start", "end"))
        and span["end"] >= span["start"]
    )
