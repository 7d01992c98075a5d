"""X-Request-ID: a well-formed id sent by the client is kept (so a client can match its call to the audit log),
anything else is replaced by a fresh uuid4 hex; views read `request.request_id`, and the response echoes it."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

HEADER = "X-Request-ID"
REQUEST_ID_MAX = 64
WELL_FORMED = re.compile(rf"[A-Za-z0-9._:-]{{1,{REQUEST_ID_MAX}}}")


def request_id_of(raw: str | None) -> str:
    if raw is not None and WELL_FORMED.fullmatch(raw):
        return raw
    return uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = request_id_of(request.headers.get(HEADER))
        request.request_id = request_id  # type: ignore[attr-defined]
        response = self.get_response(request)
        response[HEADER] = request_id
        return response
