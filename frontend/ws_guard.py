"""Websocket guards and the consumer base class that applies them: the per-user cap on open
sockets (counted in Redis, so it holds across ASGI processes), the session re-check of open sockets, and the
signals that close sockets at once on logout or on a change of the user (staff lost, deactivated, deleted).
Used by frontend/consumers.py; rules in docs/realtime.md.

Presence: one sorted set per user, `<layer prefix>:ws:user:<id>`, member = the consumer's channel name, score =
when the entry expires. A consumer refreshes its entry while open and removes it on disconnect; a process that
dies leaves entries that expire after PRESENCE_TTL seconds, so a crash cannot lock a user out for longer.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from importlib import import_module
from types import SimpleNamespace
from typing import Any

import redis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from runs.auth.ws_tickets import grant_user
from runs.messages import SessionEndedLayer, UserChangedLayer

logger = logging.getLogger(__name__)
CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_TOO_LARGE = 4413
CLOSE_TOO_MANY = 4429
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


def max_message_bytes() -> int:
    return int(getattr(settings, "WS_MAX_MESSAGE_BYTES", 4096))


def recheck_seconds() -> float:
    return float(getattr(settings, "WS_SESSION_RECHECK_SECONDS", 15.0))


def _client() -> redis.Redis:
    url = settings.REDIS_URL
    with _clients_lock:
        if url not in _clients:
            _clients[url] = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
        return _clients[url]


def _prefix() -> str:
    return settings.CHANNEL_LAYERS["default"].get("CONFIG", {}).get("prefix", "asgi")


def _key(user_id: int) -> str:
    return f"{_prefix()}:ws:user:{user_id}"


def presence_acquire(user_id: int, channel: str) -> bool:
    """Count this socket for its user; False when the user already has WS_MAX_PER_USER open."""
    now = time.time()
    ok = _client().eval(
        _ACQUIRE, 1, _key(user_id), now, now + PRESENCE_TTL, max_per_user(), channel, int(PRESENCE_TTL) + 1
    )
    return bool(ok)


def presence_refresh(user_id: int, channel: str) -> None:
    _client().zadd(_key(user_id), {channel: time.time() + PRESENCE_TTL}, xx=True)
    _client().expire(_key(user_id), int(PRESENCE_TTL) + 1)


def presence_release(user_id: int, channel: str) -> None:
    _client().zrem(_key(user_id), channel)


def presence_count() -> int:
    """Open sockets of all users, all web processes: the unexpired entries of every presence set (the
    rlcp_websocket_connections gauge; a dead process's entries expire after PRESENCE_TTL)."""
    now = time.time()
    try:
        keys = _client().scan_iter(f"{_prefix()}:ws:user:*", count=500)
        return sum(int(_client().zcount(key, now, "+inf")) for key in keys)
    except redis.RedisError:
        return 0


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
    from runs.core.visibility import visible_runs

    return visible_runs(user).filter(pk=run_id).exists()


# --- the guarded consumer -------------------------------------------------------------------------------


class AuthenticatedConsumer(AsyncJsonWebsocketConsumer):
    """Session-authenticated socket with the guards of frontend/py: a per-user cap on open sockets
    (4429 past it), a cap on the size of a client's message (4413 past it), a re-check of the session every
    WS_SESSION_RECHECK_SECONDS, and an immediate close on logout (4401) or when the user changes so that what
    this socket streams is no longer theirs (4401/4403). Refusals accept then close with an application code,
    so the browser sees why (a close before accept is a bare HTTP 403 to it). Once ended, the socket sends
    nothing more."""

    user: Any = None
    _ticket: Any = None
    ended = False
    _slot_held = False
    _guard_task: asyncio.Task | None = None

    async def refuse(self, code: int) -> None:
        await self._guard_stop()
        await self.accept()
        await self.end(code)

    async def end(self, code: int) -> None:
        """Close with `code` and forward nothing more (live messages may still be queued for us)."""
        if not self.ended:
            self.ended = True
            await self.close(code=code)

    async def send_json(self, content: Any, close: bool = False) -> None:
        if not self.ended:
            await super().send_json(content, close=close)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Clients send nothing these sockets read: a message is dropped without being decoded, and one larger
        than WS_MAX_MESSAGE_BYTES closes the socket with 4413 (daphne closes with 1009, before any application
        code runs, a message over its --websocket-max-message-size, 1 MiB by default)."""
        size = len(text_data.encode("utf-8", "surrogatepass")) if text_data is not None else len(bytes_data or b"")
        if size > max_message_bytes():
            await self.end(CLOSE_TOO_LARGE)

    def user_or_none(self) -> Any:
        user = self.scope.get("user")
        return user if user is not None and user.is_authenticated else None

    async def guard_start(self, user: Any) -> bool:
        """Count this socket for its user and watch its session; False (socket closed, 4429) past the cap."""
        self.user = user
        session = self.scope.get("session")
        self._session_key = getattr(session, "session_key", None)
        self._ticket = self.scope.get("ws_ticket")  # a script's socket: its token is re-checked instead
        if not await database_sync_to_async(presence_acquire)(user.pk, self.channel_name):
            await self.refuse(CLOSE_TOO_MANY)
            return False
        self._slot_held = True
        await self.channel_layer.group_add(user_group(user.pk), self.channel_name)
        self._guard_task = asyncio.create_task(self._guard_loop())
        return True

    async def _guard_loop(self) -> None:
        every = min(recheck_seconds(), PRESENCE_TTL / 3)
        while not self.ended:
            await asyncio.sleep(every)
            try:
                await database_sync_to_async(presence_refresh)(self.user.pk, self.channel_name)
                await self.recheck()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - Redis or the database briefly away: try again next round
                logger.warning("websocket guard check failed", exc_info=True)

    async def recheck(self) -> None:
        """Re-read the session (or the ticket's token) and the user; close if either no longer allows what this
        socket streams."""
        if self._ticket is not None:
            user = await database_sync_to_async(grant_user)(self._ticket)
        else:
            user = await database_sync_to_async(session_user)(self._session_key, self.user.pk)
        if user is None:
            return await self.end(CLOSE_UNAUTHENTICATED)
        await self.rights_check(user)

    async def rights_check(self, user: Any) -> None:
        """Subclasses: close (end) when `user`, as it is now, may no longer see this stream."""
        self.user = user

    async def session_ended(self, message: SessionEndedLayer) -> None:
        """Layer message from ws_guard on logout: close the sockets of that session."""
        if message.get("session") == session_digest(self._session_key):
            await self.end(CLOSE_UNAUTHENTICATED)

    async def user_changed(self, message: UserChangedLayer) -> None:
        await self.recheck()

    async def _guard_stop(self) -> None:
        if self._guard_task is not None:
            self._guard_task.cancel()
            self._guard_task = None
        if self._slot_held:
            self._slot_held = False
            try:
                await self.channel_layer.group_discard(user_group(self.user.pk), self.channel_name)
                await database_sync_to_async(presence_release)(self.user.pk, self.channel_name)
            except Exception:  # noqa: BLE001 - the entry expires by itself (PRESENCE_TTL)
                logger.warning("websocket presence release failed", exc_info=True)


# --- signals: close at once instead of at the next re-check ---------------------------------------------


def _send(user_id: int, message: SessionEndedLayer | UserChangedLayer) -> None:
    from runs.core.publish import group_send_now

    group_send_now(user_group(user_id), message)


def _on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is None or request is None or not hasattr(request, "session"):
        return
    _send(user.pk, SessionEndedLayer(type="session.ended", session=session_digest(request.session.session_key)))


def _on_user_change(sender: Any, instance: Any, created: bool = False, **kwargs: Any) -> None:
    if created:
        return
    user_id = instance.pk
    transaction.on_commit(lambda: _send(user_id, UserChangedLayer(type="user.changed")))


def signals_connect() -> None:
    user_logged_out.connect(_on_logout, dispatch_uid="ws_guard_logout")
    model = auth.get_user_model()
    post_save.connect(_on_user_change, sender=model, dispatch_uid="ws_guard_user_saved")
    post_delete.connect(_on_user_change, sender=model, dispatch_uid="ws_guard_user_deleted")
