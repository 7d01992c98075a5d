"""The Idempotency-Key of the mutating run endpoints (submit, cancel, resume): its OpenAPI parameter and the
answer of a request that carries one (runs/idempotency/keys.py decides whether it acts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.utils import OpenApiParameter
from rest_framework import status as http
from rest_framework.request import Request
from rest_framework.response import Response

from runs.api.run_json import run_json
from runs.idempotency import keys
from runs.models import Run

IDEMPOTENCY_KEY = OpenApiParameter(
    keys.HEADER,
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="Makes a retry act once: the first request with this key acts; a later one with the same key and "
    "body (for 24 hours, per user and operation) answers with the run it acted on and does nothing (200, header "
    "`Idempotent-Replayed: true`); the same key with another body is a 409 naming the header. 1 to 200 visible "
    "ASCII characters.",
)


def once(request: Request, scope: str, body: Any, act: Callable[[], Run], status: int) -> Response:
    """Do `act` once per Idempotency-Key (when the request has one) and answer with its run's JSON."""
    key = keys.key_from(request.headers)
    if key is None:
        return Response(run_json(act(), request), status=status)
    run, replayed = keys.act_once(owner=request.user, scope=scope, key=key, body=body, act=act)
    answer = Response(run_json(run, request), status=http.HTTP_200_OK if replayed else status)
    answer["Idempotent-Replayed"] = "true" if replayed else "false"
    return answer
