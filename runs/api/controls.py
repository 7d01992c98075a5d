"""`POST /api/runs/<id>/gate-reset/` (staff): ask a running job to reset its poisoned gate
(runs/execution/controls.py)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from runs import selectors
from runs.api import serializers as s
from runs.api.views import ERRORS, RUN_ID, ServiceView, _body
from runs.audit.record import actor_from_request
from runs.execution.controls import run_gate_reset
from runs.models import RunControl


class GateResetInputSerializer(serializers.Serializer):
    reason = serializers.CharField(help_text="why the unknown outcomes are resolved (audited; at most 500 chars)")


class RunControlSerializer(serializers.ModelSerializer):
    requested_by = serializers.CharField(source="requested_by.get_username")

    class Meta:
        model = RunControl
        fields = [
            "id",
            "run",
            "kind",
            "reason",
            "requested_by",
            "created_at",
            "delivered_at",
            "acked_at",
            "outcome",
            "detail",
        ]


class RunGateResetView(ServiceView):
    @extend_schema(
        operation_id="runs_gate_reset",
        parameters=[RUN_ID],
        request=GateResetInputSerializer,
        responses={202: RunControlSerializer, 403: s.ErrorSerializer, **ERRORS},
    )
    def post(self, request: Request, run_id: int) -> Response:
        run = selectors.run_get(user=request.user, run_id=run_id)
        control = run_gate_reset(
            run=run, by=request.user, reason=_body(request).get("reason"), actor=actor_from_request(request)
        )
        return Response(RunControlSerializer(control).data, status=202)
