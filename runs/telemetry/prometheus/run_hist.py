"""Per-run histograms kept in the run summary (`summary.hist`), folded at ingest from the run's own events:
staleness per train step; pause, drain time, leases drained and requests admitted at reopen per publication.
Pure. The collector exposes them for running runs (rlcp_run_staleness_steps, rlcp_run_publication_pause_seconds,
rlcp_run_drain_seconds, rlcp_run_publication_drained_leases, rlcp_run_publication_admitted_at_reopen), so
finished runs leave no series behind."""

from __future__ import annotations

from typing import Any

from runs.metrics.record import bucket_index
from runs.metrics.spec import RUN_ADMITTED, RUN_DRAIN, RUN_DRAINED, RUN_PAUSE, RUN_STALENESS, Metric
from runs.summary_types import RunHistogram

# summary.hist key of each per-run histogram.
HIST_KEYS: dict[str, Metric] = {
    "staleness": RUN_STALENESS,
    "pause": RUN_PAUSE,
    "drain": RUN_DRAIN,
    "drained": RUN_DRAINED,
    "admitted": RUN_ADMITTED,
}


def hist_fold(hist: Any, event_type: str, data: dict[str, Any]) -> dict[str, RunHistogram]:
    """`summary.hist` after one event: {key: {"buckets": [count per bucket, +Inf last], "sum", "count"}}."""
    out: dict[str, RunHistogram] = {k: v for k, v in (hist if isinstance(hist, dict) else {}).items() if k in HIST_KEYS}
    for key, value in _observations(event_type, data):
        metric = HIST_KEYS[key]
        stored: Any = out.get(key)  # a summary's histogram as stored (JSON)
        cur: dict[str, Any] = stored if isinstance(stored, dict) else {}
        size = len(metric.buckets) + 1
        buckets = list(cur["buckets"]) if isinstance(cur.get("buckets"), list) and len(cur["buckets"]) == size else None
        if buckets is None:
            cur, buckets = {"sum": 0.0, "count": 0}, [0] * size
        buckets[bucket_index(metric.buckets, value)] += 1
        out[key] = RunHistogram(
            buckets=buckets, sum=float(cur.get("sum", 0.0)) + value, count=int(cur.get("count", 0)) + 1
        )
    return out


def _observations(event_type: str, data: dict[str, Any]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    if event_type == "train" and _number(data.get("staleness_max")):
        out.append(("staleness", float(data["staleness_max"])))
    if event_type == "version":
        if _number(data.get("pause_ms")):
            out.append(("pause", max(0.0, float(data["pause_ms"]) / 1000)))
        phases = data.get("phases")
        drain = phases.get("drain") if isinstance(phases, dict) else None
        if isinstance(drain, dict) and _number(drain.get("start")) and _number(drain.get("end")):
            out.append(("drain", max(0.0, float(drain["end"]) - float(drain["start"]))))
        for key, field in (("drained", "drained"), ("admitted", "admitted_at_reopen")):
            if _number(data.get(field)):  # jobs that predate the counts leave these out
                out.append((key, max(0.0, float(data[field]))))
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
