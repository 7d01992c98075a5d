"""Sign-in limits without lockout of others, on django-axes (settings in config/security.py, docs/security.md).

Failures are counted per (username, client address) and per client address, by axes' cache handler (Redis when
REDIS_URL is set, so every web process shares them). Past AUTH_FAILURES_PER_USER_ADDRESS failures for one pair,
or AUTH_FAILURES_PER_IP from one address, that pair or address waits AUTH_BACKOFF_SECONDS after its last
failure, twice as long after each further failure, at most AUTH_BACKOFF_MAX_SECONDS (also how long counts are
kept after the last failure). Nothing is counted per username alone: hammering `admin` from one address never
stops `admin` signing in from another. A refused try is not counted (AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT
off), and a correct password clears its pair's count, never its address's.

Axes is wired in three places: `SignInBackend` (first in AUTHENTICATION_BACKENDS: every `authenticate()` with a
request, so the login page, the token endpoint and the admin) refuses while blocked; axes' signal handlers count
through `SignInHandler`; AxesMiddleware turns a refused admin sign-in into `lockout_response` (429). The login
page (frontend.views.auth) and the token endpoint (runs.api.auth) ask `signin_wait` first and answer 429 with
Retry-After themselves.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.handlers.cache import AxesCacheHandler
from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_cache, get_client_cache_keys, get_credentials
from django.conf import settings
from django.core.cache import BaseCache
from django.http import HttpRequest, HttpResponse, JsonResponse


def _username_field() -> str:  # axes.conf sets the setting at start-up
    return str(settings.AXES_USERNAME_FORM_FIELD)  # type: ignore[misc]


def client_ip(request: HttpRequest | Any) -> str:
    """The client's address: the socket peer, or with NUM_PROXIES trusted proxies the X-Forwarded-For entry that
    many hops from the right (what the first trusted proxy saw; a client cannot choose it). AXES_CLIENT_IP_CALLABLE."""
    meta = request.META
    proxies = settings.NUM_PROXIES
    forwarded = meta.get("HTTP_X_FORWARDED_FOR")
    if proxies and forwarded:
        hops = [h.strip() for h in forwarded.split(",") if h.strip()]
        if hops:
            return hops[-min(proxies, len(hops))]
    return meta.get("REMOTE_ADDR") or "unknown"


def signin_username(request: HttpRequest | Any, credentials: dict | None) -> str:
    """AXES_USERNAME_CALLABLE: the posted username, length-prefixed. Axes keys a (username, address) pair on the two
    strings joined, so without the prefix `admin1` from 10.0.0.1 would count against `admin` from 110.0.0.1."""
    field = _username_field()
    name = (credentials or {}).get(field)
    if name is None and request is not None:
        name = request.POST.get(field)
    name = name if isinstance(name, str) else ""  # never None: axes would then key the pair as the address
    return f"{len(name)}:{name}"


def signin_memory(request: HttpRequest | None = None) -> timedelta:
    """AXES_COOLOFF_TIME: counts live this long after their last failure (the longest wait)."""
    return timedelta(seconds=settings.AUTH_BACKOFF_MAX_SECONDS)


def _now() -> float:
    return time.time()


def _limits() -> list[int]:
    """One limit per entry of AXES_LOCKOUT_PARAMETERS ([["username", "ip_address"], "ip_address"]), in order."""
    return [settings.AUTH_FAILURES_PER_USER_ADDRESS, settings.AUTH_FAILURES_PER_IP]


def backoff_seconds(failures: int, limit: int) -> float:
    """How long after its last failure a key with this many failures waits: none below the limit, then
    AUTH_BACKOFF_SECONDS doubled per failure past it, at most AUTH_BACKOFF_MAX_SECONDS."""
    if failures < limit:
        return 0.0
    return float(min(settings.AUTH_BACKOFF_SECONDS * 2 ** min(failures - limit, 32), settings.AUTH_BACKOFF_MAX_SECONDS))


class SignInHandler(AxesCacheHandler):
    """Axes' cache handler with its own limit per lockout parameter and an exponential wait after the last failure
    (axes alone compares every key with one limit and blocks for as long as it remembers)."""

    def __init__(self) -> None:  # the cache is looked up at each use: settings (tests) may change it
        pass

    @property
    def cache(self) -> BaseCache:  # type: ignore[override]
        return get_cache()

    def wait(self, request: HttpRequest, credentials: dict | None = None) -> float:
        """Seconds until this username from this address may try again (0: now)."""
        keys = get_client_cache_keys(request, credentials)
        counts = self.cache.get_many(keys)
        lasts = self.cache.get_many([f"{key}:last" for key in keys])
        now = _now()
        wait = 0.0
        for key, limit in zip(keys, _limits(), strict=True):
            pause = backoff_seconds(counts.get(key, 0), limit)
            if pause:
                wait = max(wait, lasts.get(f"{key}:last", now) + pause - now)
        return wait

    def get_failures(self, request: HttpRequest, credentials: dict | None = None) -> int:
        return int(self.wait(request, credentials) > 0)

    def is_locked(self, request: HttpRequest, credentials: dict | None = None) -> bool:
        return self.wait(request, credentials) > 0

    def user_login_failed(self, sender: Any, credentials: dict, request: Any = None, **kwargs: Any) -> None:
        super().user_login_failed(sender, credentials, request, **kwargs)  # counts, unless this try was refused
        if request is None or request.axes_locked_out:
            return
        timeout = int(settings.AUTH_BACKOFF_MAX_SECONDS)
        self.cache.set_many({f"{key}:last": _now() for key in get_client_cache_keys(request, credentials)}, timeout)

    def user_logged_in(self, sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
        super().user_logged_in(sender, request, user, **kwargs)
        pair = get_client_cache_keys(request, get_credentials(user.get_username()))[0]
        self.cache.delete_many([pair, f"{pair}:last"])  # the pair only: the address keeps its count


class SignInBackend(AxesStandaloneBackend):
    """Axes' backend (refuses a blocked sign-in before any password check), for requests only: an in-process
    `authenticate()` without a request (the test client's `login()`) has no client to limit and passes on."""

    def authenticate(  # type: ignore[override]
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> None:
        if request is not None:
            super().authenticate(request, username, password, **kwargs)


def signin_wait(request: HttpRequest, username: str | None) -> int:
    """Whole seconds until `username` may sign in again from this request's address (0: now)."""
    AxesProxyHandler.update_request(request)
    handler = AxesProxyHandler.get_implementation()
    wait = handler.wait(request, get_credentials(username)) if isinstance(handler, SignInHandler) else 0.0
    return int(wait) + 1 if wait > 0 else 0


def lockout_response(request: HttpRequest, original_response: Any = None, credentials: Any = None) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: what AxesMiddleware answers for a sign-in the backend refused (the admin's form)."""
    credentials = credentials or getattr(request, "axes_credentials", None) or {}  # axes' async path omits them
    wait = signin_wait(request, credentials.get(_username_field())) or 1
    message = f"too many failed sign-ins for this username from this address; try again in {wait} s"
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"detail": message, "field": None}, status=429)
    else:
        response = HttpResponse(message.capitalize() + ".", status=429, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(wait)
    return response
