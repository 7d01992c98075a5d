"""The Prometheus registry of the platform and who may read it (docs/observability.md, section "Metrics").

One registry holds runs.metrics' scrape-time collector, with the websocket count from this package's presence
sets. It is served at /metrics by the web processes (frontend/views/metrics.py) and, for a separate port, by
`python manage.py metrics_serve`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.crypto import constant_time_compare
from prometheus_client import CollectorRegistry

from frontend.ws_guard import presence_count
from runs.telemetry.prometheus.collector import PlatformCollector

REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(PlatformCollector(websocket_count=presence_count))


def metrics_allowed(*, authorization: str, user: Any) -> bool:
    """METRICS_PUBLIC: anyone; else a staff session, or `Authorization: Bearer <METRICS_TOKEN>` when a token is
    configured (compared in constant time)."""
    if getattr(settings, "METRICS_PUBLIC", False):
        return True
    if user is not None and user.is_authenticated and user.is_staff:
        return True
    token = getattr(settings, "METRICS_TOKEN", "")
    scheme, _, presented = authorization.partition(" ")
    return bool(token) and scheme.lower() == "bearer" and constant_time_compare(presented.strip(), token)
