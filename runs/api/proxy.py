"""`/api/runs/<id>/v1/<path>`: the OpenAI API of a run's session server, reached through the platform (an async
Django view under daphne; the wire to the server is runs/api/proxy_upstream.py, the rules runs/api/proxy_rules.py).

In order: the caller (an API token as `Authorization: Bearer <token>`, which is what the `openai` client sends,
or `Token <token>`; else the browser session, with its CSRF check on POST) or 401; the run, which must be the
caller's own unless the caller is staff, else 404 (the same answer as no such run); the path and method (404,
405); the per-user throttle (scope `agents`, 429 with Retry-After); the body (413 over the cap, 400 for JSON
the platform's parser refuses or an envelope runs/api/proxy_rules.py refuses); then the run must be serving: a
starting or running run that has not reported its session server yet answers 503 with Retry-After, any other
run without one 404. The request goes on with the run's serving key and the caller's session id namespaced
(`ext-<user id>-<id>`); the answer says the caller's own id in `X-Session-Id`. docs/api.md.
"""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt
from rest_framework.exceptions import APIException

from runs.api.parsers import JsonLimits, body_limit, json_check, json_values_over
from runs.api.proxy_rules import ProxyRefused, body_check, external_session, route, session_id_choose
from runs.api.proxy_upstream import error_answer, forward
from runs.api.throttles import HeavyReadThrottle
from runs.api.tokens import HashedTokenAuthentication
from runs.core.visibility import visible_runs
from runs.models import Run, RunStatus

SCOPE = "agents"
NOT_SERVING_RETRY_SECONDS = 5
# A run in these states may be serving (a `stopping` run's job still runs until it has checkpointed).
SERVING_STATUSES = (RunStatus.RUNNING, RunStatus.STOPPING)
COMING_STATUSES = (RunStatus.STARTING, RunStatus.RUNNING)


class _Refused(Exception):
    def __init__(self, answer: HttpResponse) -> None:
        self.answer = answer


@csrf_exempt  # a token caller has no CSRF cookie; a session caller is checked in _caller
async def run_proxy(request: HttpRequest, run_id: int, path: str) -> HttpResponseBase:
    try:
        user = await _caller(request)
        run = await _run_for(user, run_id)
        target = route(path, request.method or "", user.pk)
        await _throttle(user)
        body = _body(request, target.upstream_path) if target.has_body else None
        if target.session_in_path is not None:
            session, fresh = target.session_in_path, False
        else:
            session, fresh = session_id_choose(body, request.headers.get("X-Session-Id"))
        serving_url = _serving_url(run)
    except ProxyRefused as exc:
        return error_answer(exc.status, exc.message, field=exc.field)
    except _Refused as exc:
        return exc.answer
    upstream_session = external_session(user.pk, session)
    if body is not None:
        body = {**body, "session_id": upstream_session}
    return await forward(
        method=request.method or "GET",
        url=f"{serving_url}/v1/{target.upstream_path}",
        keys=run.serving_keys(),
        body=body,
        session=upstream_session,
        extra={"X-Session-Id": session, **({"X-Session-Fresh": "1"} if fresh else {})},
    )


async def _caller(request: HttpRequest) -> Any:
    """The signed-in user: by API token when the request has an Authorization header, else by session (with
    Django's CSRF check on an unsafe method). _Refused 401 or 403 otherwise."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, key = header.partition(" ")
        if scheme.lower() not in ("bearer", "token") or not key.strip():
            raise _Refused(_unauthorized("Authorization must be `Bearer <token>` or `Token <token>`"))
        try:
            user, _row = await sync_to_async(HashedTokenAuthentication().authenticate_credentials)(key.strip().encode())
        except APIException as exc:
            detail = exc.detail.get("detail") if isinstance(exc.detail, dict) else exc.detail
            raise _Refused(_unauthorized(str(detail))) from None
        return user
    signed_in: AbstractBaseUser | AnonymousUser = await request.auser()  # type: ignore[attr-defined]
    if not signed_in.is_authenticated or not signed_in.is_active:
        raise _Refused(_unauthorized("sign in, or send an API token as `Authorization: Bearer <token>`"))
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        check = CsrfViewMiddleware(lambda _request: HttpResponse())
        check.process_request(request)
        refused = check.process_view(request, lambda _request: HttpResponse(), (), {})
        if refused is not None:
            raise _Refused(error_answer(403, "CSRF check failed: send the X-CSRFToken header", field="csrf"))
    return signed_in


def _unauthorized(message: str) -> HttpResponse:
    return error_answer(401, message, headers={"WWW-Authenticate": 'Bearer realm="api"'})


async def _run_for(user: Any, run_id: int) -> Run:
    """The run if the caller may use it (its owner, or staff); one 404 for no such run and not yours."""
    runs = visible_runs(user, Run.objects.only("id", "owner_id", "status", "serving_url", "attempt", "ingest_nonce"))
    run = await runs.filter(pk=run_id).afirst()
    if run is None:
        raise ProxyRefused(404, f"run {run_id} not found")
    return run


async def _throttle(user: Any) -> None:
    """The per-user rate of scope `agents` (runs/api/throttles.py: DRF's scoped throttle, counted in the cache)."""

    class View:
        throttle_scope = SCOPE

    class Caller:
        META: dict[str, str] = {}

    caller = Caller()
    caller.user = user  # type: ignore[attr-defined]
    throttle = HeavyReadThrottle()
    if not await sync_to_async(throttle.allow_request)(caller, View()):  # type: ignore[arg-type]  # duck-typed
        wait = max(1, int(throttle.wait() or 1))
        raise _Refused(
            error_answer(
                429, f"too many requests through the proxy; try again in {wait} s", headers={"Retry-After": str(wait)}
            )
        )


def _body(request: HttpRequest, path: str) -> dict[str, Any]:
    """The request's JSON body, decoded within the platform's limits (runs/api/parsers.py) and checked."""
    limit = body_limit(request.path)
    try:
        raw = request.body
    except RequestDataTooBig:
        raw = b"x" * (limit + 1)
    if len(raw) > limit:
        raise _Refused(error_answer(413, f"larger than the limit of {limit} bytes", field="body"))
    limits = JsonLimits.from_settings()
    if json_values_over(raw, limits.nodes):
        raise ProxyRefused(400, f"holds more than {limits.nodes} values", field="body")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise ProxyRefused(400, "nested too deep", field="body") from None
    except ValueError as exc:  # UnicodeDecodeError is one
        raise ProxyRefused(400, f"not valid JSON ({str(exc)[:200]})", field="body") from None
    try:
        json_check(data, limits)
    except APIException as exc:
        detail = exc.detail if isinstance(exc.detail, dict) else {"detail": str(exc.detail), "field": "body"}
        field = str(detail.get("field") or "body")
        raise ProxyRefused(400, str(detail.get("detail", "")).removeprefix(f"{field}: "), field=field) from None
    return body_check(path, data)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _serving_url(run: Run) -> str:
    if run.serving_url and run.status in SERVING_STATUSES:
        return run.serving_url
    if run.status in COMING_STATUSES:
        raise _Refused(
            error_answer(
                503,
                f"run {run.pk} has not reported its session server yet",
                headers={"Retry-After": str(NOT_SERVING_RETRY_SECONDS)},
            )
        )
    raise ProxyRefused(404, f"run {run.pk} is {run.status}: it is not serving")
