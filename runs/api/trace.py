"""The trace export of a run: its events as a Chrome trace (Trace Event Format, opens in Perfetto), built by
runs/telemetry/trace.py; a heavy read, throttled as one."""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request

from runs import selectors
from runs.api import serializers as s
from runs.api.throttles import HeavyReadThrottle, throttled_response
from runs.api.views import RUN_ID, ServiceView
from runs.telemetry.trace import run_trace


class RunTraceView(ServiceView):
    throttle_classes = [HeavyReadThrottle]
    throttle_scope = "trace"

    @extend_schema(
        operation_id="runs_trace",
        parameters=[RUN_ID],
        responses={
            200: OpenApiResponse(
                description="Chrome trace JSON (Trace Event Format: traceEvents, displayTimeUnit, otherData); "
                "opens in Perfetto. Sent as a download (Content-Disposition: attachment)."
            ),
            404: s.ErrorSerializer,
            **throttled_response(),
        },
    )
    def get(self, request: Request, run_id: int) -> HttpResponse:
        run = selectors.run_get(user=request.user, run_id=run_id)
        response = JsonResponse(run_trace(run=run))
        response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-trace.json"'
        return response
