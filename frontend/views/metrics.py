"""GET /metrics: the Prometheus exposition of frontend.metrics.REGISTRY, for those metrics_allowed admits."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from frontend.metrics import REGISTRY, metrics_allowed


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not metrics_allowed(authorization=request.headers.get("Authorization", ""), user=getattr(request, "user", None)):
        response = HttpResponse("metrics need a staff session or Authorization: Bearer <METRICS_TOKEN>\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        response["Content-Type"] = "text/plain; charset=utf-8"
        return response
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
