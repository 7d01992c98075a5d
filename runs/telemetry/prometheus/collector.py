"""The scrape-time collector: every metric of runs/metrics/spec.py, built when Prometheus scrapes.

Recorded counters and histograms are read from Redis (runs/metrics/record.py). Queue, slot, resource and
per-run series (those of agent runs: runs/telemetry/prometheus/run_agents.py) are read from the database at scrape time,
so they are right whichever process changed them and a finished run's series simply stop. The websocket count comes
from the presence sets the web processes keep in Redis (`websocket_count`, injected by the page that serves
/metrics: frontend/views/metrics.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from runs.metrics import record, spec
from runs.models import ACTIVE_STATUSES, Run, RunStatus
from runs.scheduling.finishes import progress_of
from runs.scheduling.queue import runs_queue_info
from runs.slots import store
from runs.slots.grant import PENDING_REASONS
from runs.slots.policy import CLASSES
from runs.slots.resources import MILLI, ZERO, Res
from runs.telemetry.prometheus.run_agents import agent_families
from runs.telemetry.prometheus.run_engines import engine_families
from runs.telemetry.prometheus.run_hist import HIST_KEYS
from trainer.events import GATE_STATES

# Statuses whose runs get per-run series.
RUN_SERIES_STATUSES = (RunStatus.RUNNING, RunStatus.STOPPING)


class PlatformCollector(Collector):
    def __init__(self, websocket_count: Callable[[], int] | None = None) -> None:
        self.websocket_count = websocket_count

    def collect(self) -> Iterator[Metric]:
        yield from recorded()
        yield from queue_and_slots()
        yield from per_run()
        if self.websocket_count is not None:
            yield _gauge(spec.WS_CONNECTIONS, [((), self.websocket_count())])


def recorded() -> Iterator[Metric]:
    for metric in spec.RECORDED:
        fields = record.read(metric)
        if metric.kind == "counter":
            family = CounterMetricFamily(metric.full_name, metric.help, labels=metric.labels)
            for field, value in sorted(fields.items()):
                labels = _labels(field, metric)
                if labels is not None:
                    family.add_metric(labels, value)
            yield family
        else:
            yield _histogram_from_fields(metric, fields)


def queue_and_slots() -> Iterator[Metric]:
    queued = list(Run.objects.filter(status=RunStatus.QUEUED).only("id", "status", "run_class", "resources"))
    info = runs_queue_info(runs=queued)
    pending = {(k, r): 0 for k in CLASSES for r in PENDING_REASONS}
    for run in queued:
        if run.pk in info:
            key = (run.run_class, info[run.pk].pending_reason)
            pending[key] = pending.get(key, 0) + 1
    yield _gauge(spec.RUNS_PENDING, [(k, v) for k, v in sorted(pending.items())])
    active: dict[tuple[str, str], int] = {(k, str(s)): 0 for k in CLASSES for s in ACTIVE_STATUSES}
    for run_class, status in Run.objects.filter(status__in=ACTIVE_STATUSES).values_list("run_class", "status"):
        active[(run_class, status)] = active.get((run_class, status), 0) + 1
    yield _gauge(spec.RUNS_ACTIVE, [(k, v) for k, v in sorted(active.items())])
    policy = store.policy_load()
    held = store.held_load()
    in_use = {k: 0 for k in CLASSES}
    used = ZERO
    for slot in held:
        in_use[slot.run_class] = in_use.get(slot.run_class, 0) + 1
        for bundle in slot.demand:
            used = used + bundle
    yield _gauge(spec.SLOTS_IN_USE, [((k,), v) for k, v in in_use.items()])
    yield _gauge(spec.SLOTS_LIMIT, [((k,), policy.classes[k].limit) for k in CLASSES])
    yield _gauge(spec.SLOTS_MAX_TOTAL, [((), policy.max_total)])
    capacity = ZERO
    for node in store.capacity_load().values():
        capacity = capacity + node
    for metric, res in (
        (spec.RESOURCE_CAPACITY, capacity),
        (spec.RESOURCE_USED, used),
        (spec.RESOURCE_FREE, capacity - used),
    ):
        yield _gauge(metric, _resources(res))


def per_run() -> Iterator[Metric]:
    runs = list(
        Run.objects.filter(status__in=RUN_SERIES_STATUSES)
        .only("id", "status", "kind", "summary", "config", "granted_at", "time_limit_seconds")
        .order_by("id")
    )
    gauges: dict[spec.Metric, list[tuple[tuple[str, ...], float]]] = {
        m: []
        for m in (
            spec.RUN_REWARD,
            spec.RUN_EXACT_MATCH,
            spec.RUN_STEP,
            spec.RUN_PROGRESS,
            spec.RUN_ETA,
            spec.RUN_VERSION,
            spec.RUN_GATE,
        )
    }
    hists: dict[str, HistogramMetricFamily] = {
        key: HistogramMetricFamily(m.full_name, m.help, labels=m.labels) for key, m in HIST_KEYS.items()
    }
    paces: dict[str, dict[int, float]] = {}
    for run in runs:
        summary = _dict(run.summary)
        label = (str(run.pk),)
        train = _dict(summary.get("train"))
        for metric, value in (
            (spec.RUN_REWARD, train.get("reward_mean")),
            (spec.RUN_EXACT_MATCH, train.get("exact_match")),
            (spec.RUN_STEP, train.get("step")),
            (spec.RUN_VERSION, _dict(summary.get("version")).get("version")),
        ):
            if isinstance(value, (int, float)) and _number(value):
                gauges[metric].append((label, float(value)))
        progress = progress_of(run, paces=paces)
        if progress.progress is not None:
            gauges[spec.RUN_PROGRESS].append((label, progress.progress))
        if progress.eta_finish_seconds is not None:
            gauges[spec.RUN_ETA].append((label, progress.eta_finish_seconds))
        gate = _dict(summary.get("gate"))
        if gate.get("state") in GATE_STATES:
            for state in sorted(GATE_STATES):
                gauges[spec.RUN_GATE].append(((str(run.pk), state), 1.0 if state == gate["state"] else 0.0))
        hist = _dict(summary.get("hist"))
        for key, family in hists.items():
            _add_run_histogram(family, HIST_KEYS[key], label, hist.get(key))
    for metric, samples in gauges.items():
        yield _gauge(metric, samples)
    yield from hists.values()
    yield from agent_families((str(run.pk), run.summary) for run in runs)
    yield from engine_families((str(run.pk), run.summary) for run in runs)


# --- helpers --------------------------------------------------------------------------------------------
def _gauge(metric: spec.Metric, samples: list[tuple[tuple[str, ...], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(metric.full_name, metric.help, labels=metric.labels)
    for labels, value in samples:
        family.add_metric(list(labels), float(value))
    return family


def _resources(res: Res) -> list[tuple[tuple[str, ...], float]]:
    return [(("cpu",), res.cpu / MILLI), (("gpu",), res.gpu / MILLI), (("memory_bytes",), float(res.memory))]


def _labels(field: str, metric: spec.Metric) -> list[str] | None:
    try:
        values = json.loads(field)
    except ValueError:
        return None
    if not isinstance(values, list) or len(values) != len(metric.labels):
        return None
    return [str(v) for v in values]


def _cumulative(metric: spec.Metric, counts: list[float]) -> list[tuple[str, float]]:
    out, running = [], 0.0
    for bound, count in zip([*metric.buckets, float("inf")], counts):
        running += count
        out.append((floatToGoString(bound), running))
    return out


def _histogram_from_fields(metric: spec.Metric, fields: dict[str, float]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(metric.full_name, metric.help, labels=metric.labels)
    series: dict[str, dict[str, float]] = {}
    for field, value in fields.items():
        prefix, _, part = field.rpartition("|")
        series.setdefault(prefix, {})[part] = value
    for prefix, parts in sorted(series.items()):
        labels = _labels(prefix, metric)
        if labels is None:
            continue
        counts = [parts.get(f"b{i}", 0.0) for i in range(len(metric.buckets) + 1)]
        family.add_metric(labels, _cumulative(metric, counts), parts.get("sum", 0.0))
    return family


def _add_run_histogram(family: HistogramMetricFamily, metric: spec.Metric, labels: tuple[str, ...], hist: Any) -> None:
    if not isinstance(hist, dict) or not isinstance(hist.get("buckets"), list):
        return
    counts = hist["buckets"]
    if len(counts) != len(metric.buckets) + 1 or not all(_number(c) for c in counts):
        return
    family.add_metric(list(labels), _cumulative(metric, [float(c) for c in counts]), float(hist.get("sum", 0.0)))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
