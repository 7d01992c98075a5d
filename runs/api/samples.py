"""GET /api/runs/<id>/samples/ (filtered, ordered, cursor-paginated) and GET /api/runs/<id>/samples/<sid>/.

Pagination is DRF's CursorPagination with a keyset of (ordering field, id): the cursor holds both, so pages
stay exact however many samples share a reward (DRF's own cursor falls back to an offset among ties, capped
at 1,000). Visibility is the run's (runs.selectors.run_get: owner or staff, others get 404).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Q
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

from runs import selectors
from runs.api.serializers import ErrorSerializer
from runs.api.throttles import HeavyReadThrottle, throttled_response
from runs.api.views import RUN_ID, ServiceView
from runs.errors import InvalidInput, RunNotFound
from runs.models import Sample
from runs.telemetry.sample_query import FILTERS, ORDERINGS, sample_get, sample_query_parse, samples_select
from runs.telemetry.samples import COLUMNS

LIST_FIELDS = ["id", *COLUMNS, "ts"]  # the stored columns (runs/telemetry/samples.py), with the id and time


class SampleSerializer(serializers.ModelSerializer):
    reward_parts = serializers.SerializerMethodField()

    class Meta:
        model = Sample
        fields = [*LIST_FIELDS, "reward_parts"]

    def get_reward_parts(self, obj: Sample) -> dict[str, float]:
        return dict(obj.data.get("reward_parts") or {})


class SampleDetailSerializer(SampleSerializer):
    turns = serializers.SerializerMethodField()

    class Meta(SampleSerializer.Meta):
        fields = [*LIST_FIELDS, "reward_parts", "turns"]

    def get_turns(self, obj: Sample) -> list[dict[str, Any]]:
        return list(obj.data.get("turns") or [])


class SamplePageSerializer(serializers.Serializer):
    next = serializers.CharField(allow_null=True)
    previous = serializers.CharField(allow_null=True)
    results = SampleSerializer(many=True)


class SampleCursorPagination(CursorPagination):
    """Keyset pages over (ordering field, id), both in the ordering's direction."""

    page_size = 50
    ordering = "-id"

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> list[Any]:
        """One page of `queryset` (a QuerySet of Sample) after the request's cursor, in the ordering."""
        self.request, self.base_url = request, request.build_absolute_uri()
        self.page_size = self.limit(request)
        try:
            self.cursor = self.decode_cursor(request)
        except NotFound as exc:
            raise InvalidInput("not a cursor this API gave out", field="cursor") from exc
        if self.cursor is not None and self.cursor.position is None:
            raise InvalidInput("not a cursor this API gave out", field="cursor")
        field = str(self.ordering).lstrip("-")
        reverse = bool(self.cursor and self.cursor.reverse)
        descending = str(self.ordering).startswith("-") != reverse  # the direction of this fetch
        qs = queryset.order_by(f"-{field}", "-id") if descending else queryset.order_by(field, "id")
        if self.cursor is not None:
            value, pk = self._position(field)
            op = "lt" if descending else "gt"
            qs = qs.filter(Q(**{f"{field}__{op}": value}) | Q(**{field: value, f"id__{op}": pk}))
        rows = list(qs[: self.page_size + 1])
        more = len(rows) > self.page_size
        rows = rows[: self.page_size]
        if reverse:
            rows.reverse()
        self.has_next = more if not reverse else True
        self.has_previous = (self.cursor is not None) if not reverse else more
        self.page = rows
        self.field = field
        return rows

    def limit(self, request: Request) -> int:
        most = int(getattr(settings, "SAMPLES_PAGE_MAX", 200))
        raw = request.query_params.get("limit")
        if raw is None or raw == "":
            return self.page_size
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 6 or not 1 <= int(raw) <= most:
            raise InvalidInput(f"expected an integer from 1 to {most}", field="limit")
        return int(raw)

    def _position(self, field: str) -> tuple[Any, int]:
        assert self.cursor is not None and self.cursor.position is not None
        try:
            value, pk = str(self.cursor.position).rsplit("|", 1)
            typed = float(value) if field in ("reward", "advantage") else int(value)
            return typed, int(pk)
        except ValueError as exc:
            raise InvalidInput("not a cursor this API gave out", field="cursor") from exc

    def _link(self, row: Sample, *, reverse: bool) -> str:
        position = f"{getattr(row, self.field)!r}|{row.pk}"
        # DRF keeps positions as strings (its own are str(value)); the stubs say int.
        return self.encode_cursor(Cursor(offset=0, reverse=reverse, position=position))  # type: ignore[arg-type]

    def get_next_link(self) -> str | None:
        return self._link(self.page[-1], reverse=False) if self.has_next and self.page else None

    def get_previous_link(self) -> str | None:
        return self._link(self.page[0], reverse=True) if self.has_previous and self.page else None


FILTER_PARAMS = [
    OpenApiParameter(name, str, description=f"samples with {lookup}") for name, (lookup, _) in FILTERS.items()
]


class RunSamplesView(ServiceView):
    throttle_classes = [HeavyReadThrottle]
    throttle_scope = "samples"

    @extend_schema(
        operation_id="runs_samples",
        responses={200: SamplePageSerializer, 400: ErrorSerializer, 404: ErrorSerializer, **throttled_response()},
        parameters=[
            RUN_ID,
            *FILTER_PARAMS,
            OpenApiParameter("ordering", str, enum=list(ORDERINGS), description="default -id (newest first)"),
            OpenApiParameter("limit", int, description="rows per page, 1..SAMPLES_PAGE_MAX (default 50)"),
            OpenApiParameter("cursor", str, description="the `next` or `previous` link's cursor"),
        ],
    )
    def get(self, request: Request, run_id: int) -> Response:
        run = selectors.run_get(user=request.user, run_id=run_id)
        query = sample_query_parse(request.query_params)
        paginator = SampleCursorPagination()
        paginator.ordering = query.ordering
        rows = paginator.paginate_queryset(samples_select(run=run, query=query), request, view=self)
        return paginator.get_paginated_response(SampleSerializer(rows, many=True).data)


class RunSampleDetailView(ServiceView):
    throttle_classes = [HeavyReadThrottle]
    throttle_scope = "samples"

    @extend_schema(
        operation_id="runs_sample",
        parameters=[RUN_ID, OpenApiParameter("sample_id", int, OpenApiParameter.PATH)],
        responses={200: SampleDetailSerializer, 404: ErrorSerializer, **throttled_response()},
    )
    def get(self, request: Request, run_id: int, sample_id: int) -> Response:
        run = selectors.run_get(user=request.user, run_id=run_id)
        sample = sample_get(run=run, sample_id=sample_id)
        if sample is None:
            raise RunNotFound(f"sample {sample_id} of run {run_id} not found")
        return Response(SampleDetailSerializer(sample).data)
