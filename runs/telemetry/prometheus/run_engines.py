"""The per-engine series of running runs (`rlcp_run_engine_*`): counters from the engine entries of each run's
latest `gate` event (summary.gate). An entry without the counters (an engine that does not batch, or a job older
than them) adds no sample."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric

from runs.metrics import spec
from runs.telemetry.prometheus.run_agents import as_dict, non_negative


def engine_families(summaries: Iterable[tuple[str, Any]]) -> Iterator[Metric]:
    """Families for (run label, run summary) pairs."""
    counters = {
        f: CounterMetricFamily(m.full_name, m.help, labels=m.labels) for f, m in spec.RUN_ENGINE_COUNTERS.items()
    }
    for run, summary in summaries:
        engines = as_dict(as_dict(summary).get("gate")).get("engines")
        if not isinstance(engines, list):
            continue
        for entry in engines:
            entry = as_dict(entry)
            name = entry.get("engine")
            if not isinstance(name, str):
                continue
            for field, family in counters.items():
                if non_negative(entry.get(field)):
                    family.add_metric([run, name], float(entry[field]))
    yield from counters.values()
