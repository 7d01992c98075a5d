"""Staff API for cron schedules: `GET/POST /api/schedules/`, `GET/PATCH/DELETE /api/schedules/<id>/`.
Writes go through runs.execution.schedules (cron and kind config validated there)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework import status as http
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response

from runs.api.serializers import ErrorSerializer
from runs.api.views import ServiceView, _body
from runs.audit.record import actor_from_request
from runs.errors import RunNotFound
from runs.execution import kinds, schedules
from runs.models import Schedule

ERRORS = {400: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer}


class ScheduleSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    config = serializers.JSONField()

    class Meta:
        model = Schedule
        fields = ["id", "name", "cron", "kind", "config", "enabled", "owner", "next_run_at", "last_run", "created_at"]
        read_only_fields = fields


class ScheduleCreateSerializer(serializers.Serializer):
    # Plain fields: cron/kind/config are validated by runs.execution.schedules so the 400 names the field exactly.
    name = serializers.CharField(max_length=schedules.SCHEDULE_NAME_MAX, help_text="room for the fired runs' suffix")
    cron = serializers.CharField(max_length=100, help_text="five-field cron, e.g. '0 3 * * *' (UTC)")
    kind = serializers.CharField(default=kinds.DEFAULT_KIND)
    config = serializers.JSONField(default=dict)
    enabled = serializers.BooleanField(default=True)


def _schedule(schedule_id: int) -> Schedule:
    schedule = Schedule.objects.select_related("owner").filter(pk=schedule_id).first()
    if schedule is None:
        raise RunNotFound(f"schedule {schedule_id} does not exist")
    return schedule


class ScheduleListCreateView(ServiceView):
    permission_classes = [IsAdminUser]

    @extend_schema(operation_id="schedules_list", responses={200: ScheduleSerializer(many=True)})
    def get(self, request: Request) -> Response:
        rows = Schedule.objects.select_related("owner").order_by("id")
        return Response(ScheduleSerializer(rows, many=True).data)

    @extend_schema(
        operation_id="schedules_create", request=ScheduleCreateSerializer, responses={201: ScheduleSerializer, **ERRORS}
    )
    def post(self, request: Request) -> Response:
        body = ScheduleCreateSerializer(data=_body(request))
        body.is_valid(raise_exception=True)
        schedule = schedules.schedule_create(
            owner=request.user, actor=actor_from_request(request), **body.validated_data
        )
        return Response(ScheduleSerializer(schedule).data, status=http.HTTP_201_CREATED)


class ScheduleDetailView(ServiceView):
    permission_classes = [IsAdminUser]

    @extend_schema(operation_id="schedules_retrieve", responses={200: ScheduleSerializer, **ERRORS})
    def get(self, request: Request, schedule_id: int) -> Response:
        return Response(ScheduleSerializer(_schedule(schedule_id)).data)

    @extend_schema(
        operation_id="schedules_update",
        request=ScheduleCreateSerializer(partial=True),
        responses={200: ScheduleSerializer, **ERRORS},
    )
    def patch(self, request: Request, schedule_id: int) -> Response:
        schedule = schedules.schedule_update(
            schedule=_schedule(schedule_id), changes=_body(request), actor=actor_from_request(request)
        )
        return Response(ScheduleSerializer(schedule).data)

    @extend_schema(operation_id="schedules_destroy", responses={204: None, **ERRORS})
    def delete(self, request: Request, schedule_id: int) -> Response:
        schedules.schedule_delete(schedule=_schedule(schedule_id), actor=actor_from_request(request))
        return Response(status=http.HTTP_204_NO_CONTENT)
