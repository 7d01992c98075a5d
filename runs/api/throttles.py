"""Per-user throttles of the heavy reads: trace, compare, slot dry-run, priority and samples (DRF's ScopedRateThrottle),
and of the requests through the proxy to runs' session servers (scope `agents`, runs/api/proxy.py).

Each view names its scope (`throttle_scope`); the rate is `settings.HEAVY_READ_THROTTLE_RATES[scope]` (DRF's
"<n>/<sec|min|hour|day>"), read at each request so a change of settings applies at once, with DEFAULT_RATES for
a scope the settings do not name. Requests are counted per user (every one of these views needs a signed-in
user) in the default cache, Redis in production, so the count holds across web processes. Past the rate DRF
answers 429 `{"detail": "Request was throttled. Expected available in N seconds."}` with `Retry-After: N`.
"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse
from rest_framework.throttling import ScopedRateThrottle

from runs.api.serializers import ErrorSerializer

DEFAULT_RATES: dict[str, str] = {
    "trace": "30/min",  # a whole run's Chrome trace
    "compare": "60/min",  # up to 10 runs' train events and configs
    "dry_run": "120/min",  # the submit form asks on every change of its fields
    "samples": "300/min",  # the inspector pages and filters; each answer is one bounded page
    "agents": "600/min",  # requests through the proxy to a run's session server (runs/api/proxy.py)
    "ws_ticket": "120/min",  # websocket tickets (runs/api/ws_ticket.py): one per connection a script opens
    "webhooks": "120/min",  # the webhook API (runs/api/webhooks.py): each "send test" POSTs to the user's URL
    "priority": "120/min",  # a queued run's priority factors: ranks the whole queue (the board asks on hover)
}


def heavy_read_rate(scope: str | None) -> str | None:
    if scope is None:
        return None  # a view without a scope: not throttled (DRF's own rule)
    rates = getattr(settings, "HEAVY_READ_THROTTLE_RATES", None) or {}
    return rates.get(scope, DEFAULT_RATES.get(scope))


class HeavyReadThrottle(ScopedRateThrottle):
    """ScopedRateThrottle with its rates read from settings at each request (DRF's class reads them once)."""

    def get_rate(self) -> str | None:
        return heavy_read_rate(self.scope)


def throttled_response() -> dict[int, OpenApiResponse]:
    """The 429 of a throttled view, for its schema (so clients and the schema tests expect it)."""
    return {
        429: OpenApiResponse(
            ErrorSerializer, description="past the per-user rate of this read (Retry-After: seconds to wait)"
        )
    }
