"""GET /api/audit/: the audit log for staff (runs/audit/), newest first, paginated like the other lists, with
the filters of runs.audit.query.audit_list. Read-only: every other method answers 405."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response

from runs.api.serializers import ErrorSerializer
from runs.api.tokens import HashedTokenAuthentication
from runs.api.views import ServiceView
from runs.audit.models import PLATFORM, Action
from runs.audit.query import TARGET_TYPES, audit_list, audit_row_json


class AuditEntrySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    at = serializers.DateTimeField()
    actor = serializers.CharField(help_text=f"the username at the time, or `{PLATFORM}` for automatic actions")
    actor_user_id = serializers.IntegerField(allow_null=True)
    actor_token = serializers.CharField(allow_null=True, help_text="prefix of the API token used (never the secret)")
    action = serializers.ChoiceField(choices=Action.values)
    target = serializers.CharField(help_text=f"<type>:<id>, type one of {', '.join(TARGET_TYPES)}")
    request_id = serializers.CharField(allow_null=True, help_text="X-Request-ID of the call; null without a request")
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)


class AuditPageSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = AuditEntrySerializer(many=True)


class AuditListView(ServiceView):
    # Token first: a request without credentials gets 401 with `WWW-Authenticate: Token` (not the API's usual
    # 403, which comes from session authentication being first and having no challenge).
    authentication_classes = [HashedTokenAuthentication, SessionAuthentication]
    permission_classes = [IsAdminUser]

    @extend_schema(
        operation_id="audit_list",
        responses={
            200: AuditPageSerializer,
            400: ErrorSerializer,
            401: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
        },
        parameters=[
            OpenApiParameter("page", int, description="page number (1-based)"),
            OpenApiParameter("actor", str, description=f"username, user id, or `{PLATFORM}`"),
            OpenApiParameter("action", str, enum=Action.values),
            OpenApiParameter("target", str, description="<type>:<id>, e.g. run:12"),
            OpenApiParameter("since", str, description="ISO 8601 date-time (no offset: UTC), inclusive"),
            OpenApiParameter("until", str, description="ISO 8601 date-time (no offset: UTC), inclusive"),
        ],
    )
    def get(self, request: Request) -> Response:
        rows = audit_list(request.query_params)
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(rows, request, view=self)
        assert page is not None  # None only without a page size; REST_FRAMEWORK["PAGE_SIZE"] is set
        return paginator.get_paginated_response([audit_row_json(row) for row in page])
