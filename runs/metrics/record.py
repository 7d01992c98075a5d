"""Counters and histograms recorded where things happen (web: ingest; any process: grants; workers: task
failures; the tick), kept in Redis so that every process, on any host, adds to the same series and the
collector of any web process exposes the sum. Recording is best effort: a Redis error is logged and never
fails the ingest, grant or task that records.

Layout: one hash per metric, `<METRICS_REDIS_PREFIX>:<name>`. A counter's field is its label values as a JSON
list; a histogram's fields are `<labels>|b<i>` (observations in bucket i, not cumulative; i = len(buckets) is
+Inf), `<labels>|sum` and `<labels>|count`.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis
from django.conf import settings

from runs.metrics.spec import Metric

logger = logging.getLogger(__name__)
_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()
_last_warning = 0.0


def client() -> redis.Redis:
    url = settings.REDIS_URL
    with _lock:
        if url not in _clients:
            _clients[url] = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        return _clients[url]


def key_of(metric: Metric) -> str:
    return f"{getattr(settings, 'METRICS_REDIS_PREFIX', 'rlcp:metrics')}:{metric.name}"


def labels_field(values: Iterable[str]) -> str:
    return json.dumps([str(v) for v in values])


def bucket_index(buckets: tuple[float, ...], value: float) -> int:
    """The first bucket whose upper bound holds `value` (len(buckets): +Inf)."""
    return bisect.bisect_left(buckets, value)


class Batch:
    """Increments gathered in memory and written in one pipelined round trip (`commit`)."""

    def __init__(self) -> None:
        self.increments: dict[tuple[str, str], float] = {}

    def add(self, metric: Metric, labels: tuple[str, ...] = (), by: float = 1.0) -> Batch:
        key = (key_of(metric), labels_field(labels))
        self.increments[key] = self.increments.get(key, 0.0) + by
        return self

    def observe(self, metric: Metric, labels: tuple[str, ...], values: Iterable[float]) -> Batch:
        prefix = labels_field(labels)
        key = key_of(metric)
        for value in values:
            for field, by in (
                (f"{prefix}|b{bucket_index(metric.buckets, value)}", 1.0),
                (f"{prefix}|sum", float(value)),
                (f"{prefix}|count", 1.0),
            ):
                self.increments[(key, field)] = self.increments.get((key, field), 0.0) + by
        return self

    def commit(self) -> None:
        if not self.increments:
            return
        try:
            pipe = client().pipeline(transaction=False)
            for (key, field), by in self.increments.items():
                pipe.hincrbyfloat(key, field, by)
            pipe.execute()
        except redis.RedisError as exc:
            _warn(exc)
        self.increments = {}


def read(metric: Metric) -> dict[str, float]:
    """The stored fields of a metric's hash ({} when Redis does not answer: the scrape still succeeds)."""
    try:
        raw: dict[Any, Any] = client().hgetall(key_of(metric))  # type: ignore[assignment]
    except redis.RedisError as exc:
        _warn(exc)
        return {}
    return {k.decode(): float(v) for k, v in raw.items()}


def timed(metric: Metric, started: float, labels: tuple[str, ...] = ()) -> None:
    """Observe the seconds since `started` (time.monotonic()) into a histogram."""
    Batch().observe(metric, labels, [time.monotonic() - started]).commit()


def _warn(exc: Exception) -> None:
    global _last_warning
    now = time.monotonic()
    if now - _last_warning > 60:
        _last_warning = now
        logger.warning("metrics: Redis did not answer (%s); this process's metrics are not recorded", exc)
