"""Websocket guards: the per-user cap on open sockets (counted in Redis, so it holds across ASGI processes),
the session re-check of open sockets, and the signals that close sockets at once on logout or on a change of
the user (staff lost, deactivated, deleted). Used by frontend/consumers.py; rules in docs/realtime.md.

Presence: one sorted set per user, `<layer prefix>:ws:user:<id>`, member = the consumer's channel name, score =
when the entry expires. A consumer refreshes its entry while open and removes it on disconnect; a process that
dies leaves entries that expire after PRESENCE_TTL seconds, so a crash cannot lock a user out for longer.
"""
from __future__ import annotations

import hashlib
import threading
import time
from importlib import import_module
from types import SimpleNamespace
from typing import Any

import redis
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save

PRESENCE_TTL = 90.0  # seconds an entry lives without a refresh (consumers refresh every PRESENCE_TTL / 3)

# Atomic take-a-slot: drop expired entries, refuse at the cap, else add (or refresh) this socket.
_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZSCORE', KEYS[1], ARGV[4]) == false and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""

_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()


def max_per_user() -> int:
    return int(getattr(settings, "WS_MAX_PER_USER", 20))


def recheck_seconds() -> float:
    return float(getattr(settings, "WS_SESSION_RECHECK_SECONDS", 15.0))


def _client() -> redis.Redis:
    url = settings.REDIS_URL
    with _clients_lock:
        if url not in _clients:
            _clients[url] = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
        return _clients[url]


def _key(user_id: int) -> str:
    prefix = settings.CHANNEL_LAYERS["default"].get("CONFIG", {}).get("prefix", "asgi")
    return f"{prefix}:ws:user:{user_id}"


def presence_acquire(user_id: int, channel: str) -> bool:
    """Count this socket for its user; False when the user already has WS_MAX_PER_USER open."""
    now = time.time()
    ok = _client().eval(_ACQUIRE, 1, _key(user_id), now, now + PRESENCE_TTL, max_per_user(), channel,
                        int(PRESENCE_TTL) + 1)
    return bool(ok)


def presence_refresh(user_id: int, channel: str) -> None:
    _client().zadd(_key(user_id), {channel: time.time() + PRESENCE_TTL}, xx=True)
    _client().expire(_key(user_id), int(PRESENCE_TTL) + 1)


def presence_release(user_id: int, channel: str) -> None:
    _client().zrem(_key(user_id), channel)


def user_group(user_id: int) -> str:
    """Channels group of every socket of one user (logout and user changes are sent there)."""
    return f"ws.user.{user_id}"


def session_digest(session_key: str | None) -> str:
    """What the logout message carries instead of the session key itself (the layer is Redis pub/sub)."""
    return hashlib.sha256((session_key or "").encode()).hexdigest()


def session_user(session_key: str | None, user_id: int) -> Any:
    """The session's user, read fresh from the session store and the database (active, password hash
    unchanged, Django's own checks), or None when the session no longer logs this user in."""
    if not session_key:
        return None
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = auth.get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]
    if not user.is_authenticated or user.pk != user_id:
        return None
    return user


def run_visible(user: Any, run_id: int) -> bool:
    from runs.models import Run

    return bool(user.is_staff or Run.objects.filter(pk=run_id, owner_id=user.pk).exists())


# --- signals: close at once instead of at the next re-check ---------------------------------------------

def _send(user_id: int, message: dict[str, Any]) -> None:
    from runs.realtime import group_send_now

    group_send_now(user_group(user_id), message)


def _on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is None or request is None or not hasattr(request, "session"):
        return
    message = {"type": "session.ended", "session": session_digest(request.session.session_key)}
    _send(user.pk, message)


def _on_user_change(sender: Any, instance: Any, created: bool = False, **kwargs: Any) -> None:
    if created:
        return
    user_id = instance.pk
    transaction.on_commit(lambda: _send(user_id, {"type": "user.changed"}))


def signals_connect() -> None:
    user_logged_out.connect(_on_logout, dispatch_uid="ws_guard_logout")
    model = auth.get_user_model()
    post_save.connect(_on_user_change, sender=model, dispatch_uid="ws_guard_user_saved")
    post_delete.connect(_on_user_change, sender=model, dispatch_uid="ws_guard_user_deleted")
