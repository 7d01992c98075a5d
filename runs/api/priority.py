"""GET /api/runs/<id>/priority/: why a queued run is where it is in the queue (class priority, aging, max wait,
fair-share usage and rank, the per-user limit, the team's quota) and the order key they combine into
(runs/slots/order.py). Visible like the run: its owner or staff, else 404; throttled per user as a heavy read (it
ranks the whole queue)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from runs import selectors
from runs.api import serializers as s
from runs.api.throttles import HeavyReadThrottle, throttled_response
from runs.api.views import RUN_ID, ServiceView
from runs.scheduling.priority import run_priority


class AgingSerializer(serializers.Serializer):
    per_hour = serializers.IntegerField()
    cap = serializers.IntegerField()
    bonus = serializers.FloatField(help_text="priority points aging adds now")


class MaxWaitSerializer(serializers.Serializer):
    seconds = serializers.IntegerField(allow_null=True)
    overdue = serializers.BooleanField(help_text="waited past max_wait_seconds: goes before non-overdue runs")


class FairShareSerializer(serializers.Serializer):
    enabled = serializers.BooleanField()
    usage = serializers.FloatField(help_text="owner's decayed dominant share, divided by the weight")
    weight = serializers.IntegerField()
    rank = serializers.IntegerField(allow_null=True, help_text="owner's rank by usage in the class (1: least)")
    owners = serializers.IntegerField(help_text="owners with waiting runs in the class")


class UserLimitSerializer(serializers.Serializer):
    max_running_per_user = serializers.IntegerField(allow_null=True)
    held = serializers.IntegerField()
    reached = serializers.BooleanField()


class TeamSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(help_text="the class has team quotas")
    team = serializers.CharField(allow_null=True, help_text="the owner's team (a group); null: the remainder team")
    quota = serializers.IntegerField(allow_null=True, help_text="the team's nominal slots of the class")
    held = serializers.IntegerField(help_text="runs of the class the team holds")
    borrowing_limit = serializers.IntegerField(allow_null=True, help_text="slots above the quota (null: no bound)")
    state = serializers.ChoiceField(
        choices=["within_quota", "borrowing", "quota_reached"],
        allow_null=True,
        help_text="under its quota (served first), borrowing idle slots, or held back (team_quota_reached)",
    )


class FactorsSerializer(serializers.Serializer):
    run_class = serializers.CharField()
    class_priority = serializers.IntegerField()
    waited_seconds = serializers.FloatField()
    aging = AgingSerializer()
    effective_priority = serializers.FloatField()
    max_wait = MaxWaitSerializer()
    fair_share = FairShareSerializer()
    user_limit = UserLimitSerializer()
    team = TeamSerializer()
    order = serializers.CharField(help_text="how the factors combine into the order")
    key = serializers.ListField(child=serializers.JSONField(), help_text="[not overdue, -priority, requested, id]")


class RunPrioritySerializer(serializers.Serializer):
    run_id = serializers.IntegerField()
    status = serializers.CharField()
    position = s.PositionSerializer(allow_null=True, help_text="grant order; null unless queued")
    factors = FactorsSerializer(allow_null=True, help_text="null unless the run is queued")


class RunPriorityView(ServiceView):
    throttle_classes = [HeavyReadThrottle]
    throttle_scope = "priority"

    @extend_schema(
        operation_id="runs_priority",
        parameters=[RUN_ID],
        responses={200: RunPrioritySerializer, 404: s.ErrorSerializer, **throttled_response()},
    )
    def get(self, request: Request, run_id: int) -> Response:
        return Response(run_priority(run=selectors.run_get(user=request.user, run_id=run_id)))
