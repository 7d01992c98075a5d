"""`GET /api/runs/compare/?runs=1,2,3`: the train metrics and config diff of up to 10 runs (runs.telemetry.compare).
Runs the user may not see are listed in `not_found`, exactly like ids that do not exist."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from runs.api.serializers import ErrorSerializer
from runs.api.throttles import HeavyReadThrottle, throttled_response
from runs.api.views import ServiceView
from runs.telemetry.compare import COMPARE_POINTS_MAX, COMPARE_RUNS_MAX, compare_ids_parse, run_compare


class CompareRunSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    owner = serializers.CharField()
    status = serializers.CharField()
    steps = serializers.IntegerField(help_text="train events stored")
    stride = serializers.IntegerField(help_text="every stride-th train event is returned (and the last)")
    step = serializers.ListField(child=serializers.IntegerField())
    elapsed = serializers.ListField(child=serializers.FloatField(), help_text="seconds since the run started")
    metrics = serializers.DictField(
        child=serializers.ListField(child=serializers.FloatField(allow_null=True)),
        help_text="every numeric scalar of the train events' data, one column per key, aligned with `step`",
    )


class ConfigDiffRowSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="dotted path of a nested key")
    values = serializers.ListField(child=serializers.JSONField(allow_null=True), help_text="per run, in order")
    missing = serializers.ListField(child=serializers.BooleanField(), help_text="true where the run lacks the key")


class CompareSerializer(serializers.Serializer):
    runs = CompareRunSerializer(many=True)
    not_found = serializers.ListField(child=serializers.IntegerField())
    metrics = serializers.ListField(child=serializers.CharField())
    config_diff = ConfigDiffRowSerializer(many=True)


class RunCompareView(ServiceView):
    throttle_classes = [HeavyReadThrottle]
    throttle_scope = "compare"

    @extend_schema(
        operation_id="runs_compare",
        parameters=[
            OpenApiParameter(
                "runs",
                str,
                required=True,
                description=f"1 to {COMPARE_RUNS_MAX} comma-separated run ids; at most {COMPARE_POINTS_MAX} "
                "points per run come back",
            )
        ],
        responses={200: CompareSerializer, 400: ErrorSerializer, **throttled_response()},
    )
    def get(self, request: Request) -> Response:
        run_ids = compare_ids_parse(request.query_params.get("runs"))
        return Response(run_compare(user=request.user, run_ids=run_ids))
