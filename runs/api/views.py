"""REST views: one thin view per operation; business rules live in runs/core, runs/execution, runs/scheduling
(the writes) and runs.selectors (the reads)."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import page_not_found
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status as http
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from runs import selectors
from runs.api import serializers as s
from runs.api.idempotent import IDEMPOTENCY_KEY, once
from runs.api.run_json import runs_json
from runs.api.throttles import HeavyReadThrottle, throttled_response
from runs.audit.record import actor_from_request
from runs.core.cancel import run_cancel
from runs.errors import InvalidInput, ServiceError
from runs.execution.kinds import DEFAULT_KIND
from runs.execution.submit import run_demand, run_resources, run_submit
from runs.models import RunClass, RunStatus
from runs.scheduling import limits
from runs.scheduling.enqueue import run_resume
from runs.scheduling.queue import slot_dry_run

ERRORS = {400: s.ErrorSerializer, 404: s.ErrorSerializer, 409: s.ErrorSerializer}
RUN_ID = OpenApiParameter("run_id", int, OpenApiParameter.PATH, description="run id")


def api_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404 for unrouted URLs (config.urls.handler404): JSON under /api/, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": f"{request.path} not found", "field": None}, status=404)
    return page_not_found(request, exception or Http404())


class ServiceView(APIView):
    """Maps service errors to JSON answers: 400 naming the field, 404, 409."""

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, ServiceError):
            return Response(exc.as_dict(), status=exc.status_code)
        if isinstance(exc, ValidationError):  # serializer errors: same shape, first field named
            field, message = _first_error(exc.detail)
            return Response(
                {"detail": f"{field}: {message}" if field else message, "field": field or None, "errors": exc.detail},
                status=400,
            )
        return super().handle_exception(exc)


def _first_error(detail: Any, prefix: str = "") -> tuple[str, str]:
    if isinstance(detail, dict) and detail:
        key, value = next(iter(detail.items()))
        name = key if key != "non_field_errors" else ""
        return _first_error(value, f"{prefix}.{name}" if prefix and name else (name or prefix))
    if isinstance(detail, list) and detail:
        return _first_error(detail[0], prefix)
    return prefix, str(detail)


def _body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise InvalidInput("request body must be a JSON object", field="body")
    return request.data


class RunListCreateView(ServiceView):
    @extend_schema(
        operation_id="runs_list",
        responses={200: s.RunPageSerializer, 400: s.ErrorSerializer, 404: s.ErrorSerializer},
        parameters=[
            OpenApiParameter("page", int, description="page number (1-based)"),
            OpenApiParameter("status", str, enum=RunStatus.values, description="only runs in this status"),
            OpenApiParameter("run_class", str, enum=RunClass.values, description="only runs of this class"),
        ],
    )
    def get(self, request: Request) -> Response:
        qs = selectors.run_list(
            user=request.user,
            status=request.query_params.get("status"),
            run_class=request.query_params.get("run_class"),
        )
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(qs, request, view=self)
        assert page is not None  # None only without a page size; REST_FRAMEWORK["PAGE_SIZE"] is set
        return paginator.get_paginated_response(runs_json(list(page), request))

    @extend_schema(
        operation_id="runs_create",
        request=s.RunSubmitSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={
            201: s.RunSerializer,
            200: OpenApiResponse(s.RunSerializer, description="a retry with the same Idempotency-Key and body"),
            **ERRORS,
            403: OpenApiResponse(s.ErrorSerializer, description="`origin` claimed but not earned (field `origin`)"),
            429: OpenApiResponse(
                s.ErrorSerializer,
                description="a per-user cap is reached: field `max_queued_per_user` or `max_running_per_user`",
            ),
        },
    )
    def post(self, request: Request) -> Response:
        raw = _body(request)
        body = s.RunSubmitSerializer(data=raw)
        body.is_valid(raise_exception=True)
        fields = dict(body.validated_data)
        fields["origin"] = limits.origin_for_request(
            claimed=fields.get("origin"),
            is_staff=request.user.is_staff,
            via_session=isinstance(request.successful_authenticator, SessionAuthentication),
        )
        submit = partial(run_submit, owner=request.user, actor=actor_from_request(request), **fields)
        return once(request, "runs_create", raw, submit, http.HTTP_201_CREATED)


class RunDetailView(ServiceView):
    @extend_schema(
        operation_id="runs_retrieve", parameters=[RUN_ID], responses={200: s.RunSerializer, 404: s.ErrorSerializer}
    )
    def get(self, request: Request, run_id: int) -> Response:
        return Response(runs_json([selectors.run_get(user=request.user, run_id=run_id)], request)[0])


class RunCancelView(ServiceView):
    @extend_schema(
        operation_id="runs_cancel",
        parameters=[RUN_ID, IDEMPOTENCY_KEY],
        request=None,
        responses={200: s.RunSerializer, **ERRORS},
    )
    def post(self, request: Request, run_id: int) -> Response:
        run = selectors.run_get(user=request.user, run_id=run_id)
        cancel = partial(run_cancel, run=run, by=actor_from_request(request))
        return once(request, f"runs_cancel:{run.pk}", None, cancel, http.HTTP_200_OK)


class RunResumeView(ServiceView):
    @extend_schema(
        operation_id="runs_resume",
        parameters=[RUN_ID, IDEMPOTENCY_KEY],
        request=s.RunResumeInputSerializer,
        responses={
            200: s.RunSerializer,
            **ERRORS,
            409: OpenApiResponse(
                s.ErrorSerializer,
                description="the run is not failed or cancelled (field `status`), or it has no checkpoint to "
                'resume from (code `no_checkpoint`, field `from_scratch`: send {"from_scratch": true})',
            ),
            429: s.ErrorSerializer,
        },
    )
    def post(self, request: Request, run_id: int) -> Response:
        from_scratch = _body(request).get("from_scratch", False)
        if not isinstance(from_scratch, bool):
            raise InvalidInput("must be true or false", field="from_scratch")
        run = selectors.run_get(user=request.user, run_id=run_id)
        resume = partial(run_resume, run=run, by=actor_from_request(request), from_scratch=from_scratch)
        return once(request, f"runs_resume:{run.pk}", {"from_scratch": from_scratch}, resume, http.HTTP_200_OK)


class RunEventsView(ServiceView):
    @extend_schema(
        operation_id="runs_events",
        responses={200: s.RunEventSerializer(many=True), **ERRORS},
        parameters=[
            RUN_ID,
            OpenApiParameter("after", int, description="only events with seq greater than this"),
            OpenApiParameter(
                "limit",
                int,
                description="page size, 1..EVENTS_PAGE_MAX (default the max, 1000); "
                "a full page carries a Link rel=next header: ask again with after=<last seq>",
            ),
        ],
    )
    def get(self, request: Request, run_id: int) -> Response:
        raw = request.query_params.get("after", "0")
        # ASCII only: str.isdigit() is true for "١٢" and "²" too (and int() refuses the latter); 18 digits fit 64 bits.
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
            raise InvalidInput("must be a non-negative integer", field="after")
        limit = _events_limit(request)
        run = selectors.run_get(user=request.user, run_id=run_id)
        events = selectors.run_events_list(run=run, after=int(raw), limit=limit)
        response = Response(s.RunEventSerializer(events, many=True).data)
        if len(events) == limit:
            response["Link"] = f'</api/runs/{run.pk}/events/?after={events[-1].seq}&limit={limit}>; rel="next"'
        return response


def _events_limit(request: Request) -> int:
    """The events page size: at most settings.EVENTS_PAGE_MAX, so no request reads an unbounded history."""
    from django.conf import settings

    most = int(getattr(settings, "EVENTS_PAGE_MAX", 1000))
    raw = request.query_params.get("limit")
    if raw is None:
        return most
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw[:6]) <= most or len(raw) > 6:
        raise InvalidInput(f"must be an integer from 1 to {most}", field="limit")
    return int(raw)


class SlotsView(ServiceView):
    @extend_schema(operation_id="slots_snapshot", responses={200: s.SlotsSnapshotSerializer})
    def get(self, request: Request) -> Response:
        return Response(selectors.slots_snapshot())


class SlotDryRunView(ServiceView):
    throttle_classes = [HeavyReadThrottle]
    throttle_scope = "dry_run"

    @extend_schema(
        operation_id="slots_dry_run",
        request=s.DryRunInputSerializer,
        responses={200: s.DryRunSerializer, 400: s.ErrorSerializer, **throttled_response()},
    )
    def post(self, request: Request) -> Response:
        body = _body(request)
        resources = None
        if body.get("config") is not None or body.get("kind") is not None:
            _kind, _config, resources = run_demand(
                kind=body.get("kind", DEFAULT_KIND), config=body.get("config", {}), owner=request.user
            )
        limit = body.get("time_limit_seconds")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise InvalidInput("must be a positive integer number of seconds", field="time_limit_seconds")
        if limit is None and resources is not None:
            limit = limits.limits_load().default_time_limit_seconds
        dry = slot_dry_run(
            origin=body.get("origin"), resources=resources, time_limit_seconds=limit, owner=request.user.pk or 0
        )
        return Response(dry)


class RunResourcesView(ServiceView):
    @extend_schema(
        operation_id="runs_resources",
        request=s.RunResourcesInputSerializer,
        responses={200: s.RunResourcesSerializer, 400: s.ErrorSerializer},
    )
    def post(self, request: Request) -> Response:
        """The demand a run of this kind and config would have (its `resources`), without submitting it."""
        body = _body(request)
        return Response(
            run_resources(kind=body.get("kind", DEFAULT_KIND), config=body.get("config"), owner=request.user)
        )
