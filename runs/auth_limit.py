"""Sign-in failure limits: too many wrong passwords for one username, or from one client address, and
sign-in answers 429 for the rest of the window (settings AUTH_FAILURES_PER_USERNAME / AUTH_FAILURES_PER_IP /
AUTH_FAILURE_WINDOW_SECONDS). Counters live in the Django cache (Redis when REDIS_URL is set), so every web
process shares them.

Enforced in three places: `LimitedModelBackend` (every `authenticate()`: login page, token endpoint, admin)
counts failures and refuses while blocked; the login page (frontend.views.auth) and the token endpoint
(runs.api.auth) ask `signin_wait` first and answer 429 with Retry-After instead of "wrong password".
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest


def client_ip(request: HttpRequest | Any) -> str:
    """The client's address: the socket peer, or with NUM_PROXIES trusted proxies the X-Forwarded-For entry that
    many hops from the right (what the first trusted proxy saw; a client cannot choose it)."""
    meta = request.META
    proxies = settings.NUM_PROXIES
    forwarded = meta.get("HTTP_X_FORWARDED_FOR")
    if proxies and forwarded:
        hops = [h.strip() for h in forwarded.split(",") if h.strip()]
        if hops:
            return hops[-min(proxies, len(hops))]
    return meta.get("REMOTE_ADDR") or "unknown"


def _keys(username: str | None, ip: str | None) -> list[tuple[str, int]]:
    keys = []
    if username:
        digest = hashlib.sha256(username.strip().lower().encode("utf-8", "replace")).hexdigest()[:32]
        keys.append((f"signin-fail:user:{digest}", settings.AUTH_FAILURES_PER_USERNAME))
    if ip:
        keys.append((f"signin-fail:ip:{ip}", settings.AUTH_FAILURES_PER_IP))
    return keys


def signin_wait(username: str | None, ip: str | None) -> int:
    """Seconds until sign-in is allowed again for this username or address (0: allowed now)."""
    wait = 0
    now = time.time()
    for key, limit in _keys(username, ip):
        count = cache.get(key) or 0
        if count >= limit:
            until = cache.get(f"{key}:until") or now + settings.AUTH_FAILURE_WINDOW_SECONDS
            wait = max(wait, int(until - now) + 1)
    return wait


def signin_failed(username: str | None, ip: str | None) -> None:
    """Count one failure for the username and the address; each window starts at its first failure."""
    window = settings.AUTH_FAILURE_WINDOW_SECONDS
    for key, _limit in _keys(username, ip):
        if cache.add(key, 0, timeout=window):
            cache.set(f"{key}:until", time.time() + window, timeout=window)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, timeout=window)


def signin_succeeded(username: str | None) -> None:
    """A correct password clears the username's count (not the address's: one valid account must not let an
    address keep guessing other accounts' passwords)."""
    for key, _limit in _keys(username, None):
        cache.delete_many([key, f"{key}:until"])


class LimitedModelBackend(ModelBackend):
    """ModelBackend that counts failed passwords and refuses (even a right one) while the username or the
    client address is blocked."""

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> Any:
        if username is None:
            username = kwargs.get(self._username_field())
        ip = client_ip(request) if request is not None else None
        if signin_wait(username, ip):
            raise PermissionDenied("too many failed sign-ins")  # authenticate() then answers None
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            signin_failed(username, ip)
        else:
            signin_succeeded(username)
        return user

    @staticmethod
    def _username_field() -> str:
        from django.contrib.auth import get_user_model

        return get_user_model().USERNAME_FIELD
