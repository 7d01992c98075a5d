"""Per-run agent series: each running run's latest `agents` event (kept in `summary.agents` by ingest) as
Prometheus families. Live sessions per engine, requests waiting at the gate and the mean reward parts are gauges;
requests, tokens, error answers by status, episodes and tool calls are counters (the job's own, cumulative since
its attempt started). Pure: the collector (runs/telemetry/prometheus/collector.py) passes the runs it already read."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from runs.metrics import spec
from trainer.step_schema import AGENT_STATUSES


def agent_families(summaries: Iterable[tuple[str, Any]]) -> Iterator[Metric]:
    """Families for (run label, run summary) pairs; a run without an `agents` summary adds no sample."""
    gauges = {m: _gauge(m) for m in (spec.RUN_AGENT_SESSIONS, spec.RUN_AGENT_WAITING, spec.RUN_AGENT_REWARD_PART)}
    counters = {m: _counter(m) for m in (*spec.RUN_AGENT_COUNTERS.values(), spec.RUN_AGENT_ERRORS)}
    for run, summary in summaries:
        agents = summary.get("agents") if isinstance(summary, dict) else None
        if not isinstance(agents, dict):
            continue
        for engine, n in sorted(as_dict(agents.get("sessions_per_engine")).items()):
            if non_negative(n):
                gauges[spec.RUN_AGENT_SESSIONS].add_metric([run, str(engine)], float(n))
        if non_negative(agents.get("waiting")):
            gauges[spec.RUN_AGENT_WAITING].add_metric([run], float(agents["waiting"]))
        for part, v in sorted(as_dict(agents.get("reward_parts")).items()):
            if non_negative(v):
                gauges[spec.RUN_AGENT_REWARD_PART].add_metric([run, str(part)], float(v))
        for field, metric in spec.RUN_AGENT_COUNTERS.items():
            if non_negative(agents.get(field)):
                counters[metric].add_metric([run], float(agents[field]))
        status = as_dict(agents.get("status"))
        for code in AGENT_STATUSES:
            if non_negative(status.get(code)):
                counters[spec.RUN_AGENT_ERRORS].add_metric([run, code], float(status[code]))
    yield from gauges.values()
    yield from counters.values()


def _gauge(metric: spec.Metric) -> GaugeMetricFamily:
    return GaugeMetricFamily(metric.full_name, metric.help, labels=metric.labels)


def _counter(metric: spec.Metric) -> CounterMetricFamily:
    return CounterMetricFamily(metric.full_name, metric.help, labels=metric.labels)


def as_dict(value: Any) -> dict[str, Any]:
    """`value` when it is a dict, else {} (a summary is the job's data: any part may be missing or odd)."""
    return value if isinstance(value, dict) else {}


def non_negative(value: Any) -> bool:
    """A number a sample may take: not a bool, not NaN, not below 0."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and value >= 0
