"""`POST /api/runs/<id>/ingest/`: a job's event batches, authenticated by the run's own token (not a user)."""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from runs.api.serializers import ErrorSerializer
from runs.errors import ServiceError
from runs.telemetry.ingest import run_events_ingest, run_for_ingest
from runs.telemetry.ingest_validate import BatchTooLarge, ingest_body_check, ingest_limits


class ControlCommandSerializer(serializers.Serializer):
    """Documents trainer.events.ControlCommand."""

    id = serializers.IntegerField()
    kind = serializers.CharField()
    reason = serializers.CharField()
    requested_by = serializers.CharField()


class IngestResultSerializer(serializers.Serializer):
    """Documents trainer.events.IngestReply (what runs.telemetry.ingest.IngestResult.as_dict returns)."""

    stored = serializers.IntegerField()
    duplicates = serializers.IntegerField()
    last_seq = serializers.IntegerField()
    status = serializers.CharField()
    dropped = serializers.IntegerField(help_text="events not stored by the run's event budget (docs/realtime.md)")
    commands = ControlCommandSerializer(many=True, help_text="staff commands the job has not answered yet")


class TooLargeSerializer(serializers.Serializer):
    detail = serializers.CharField()
    limit = serializers.IntegerField(help_text="the cap in bytes")


class RunIngestView(APIView):
    """Store a batch of trainer events (docs/realtime.md). Auth: `Authorization: Bearer <RUN_INGEST_TOKEN>`."""

    # The per-run token is checked by the service; session/API-token users have no business here.
    authentication_classes: list = []
    permission_classes: list = []

    @extend_schema(
        request={"application/json": {"type": "array", "items": {"type": "object"}}},
        # 400: an event breaks the schema (its field and seq named); 401: not this run's current token, or no such
        # run (one answer); 409: run finished, or the batch's attempt was replaced; 413: the batch is over the cap;
        # 404: the path names no run id at all (not an integer: routing answers before the view).
        responses={
            200: IngestResultSerializer,
            400: ErrorSerializer,
            401: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
            413: TooLargeSerializer,
        },
        auth=[],
    )
    def post(self, request: Request, run_id: int) -> Response:
        header = request.headers.get("Authorization", "")
        token = header[len("Bearer ") :].strip() if header.startswith("Bearer ") else None
        try:
            run = run_for_ingest(run_id=run_id, token=token)
            ingest_body_check(_body_size(request))  # before parsing
            result = run_events_ingest(run=run, payload=request.data)
        except ServiceError as exc:
            return Response(exc.as_dict(), status=exc.status_code)
        return Response(result.as_dict())


def _body_size(request: Request) -> int:
    """The post's size: its Content-Length when it says, else its body read (a chunked post); over Django's own
    read cap (DATA_UPLOAD_MAX_MEMORY_SIZE) it is too large too."""
    declared = request.META.get("CONTENT_LENGTH")
    if declared and declared.isdigit():
        ingest_body_check(int(declared))
    try:
        return len(request.body)
    except RequestDataTooBig:
        limit = ingest_limits()[1]
        raise BatchTooLarge(int(declared) if declared and declared.isdigit() else limit + 1, limit) from None
