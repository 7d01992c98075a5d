"""Websocket tickets: how a client that signs in with an API token, not a browser session, opens `/ws/runs/<id>/`
and `/ws/dashboard/` without its token ever going into a URL that proxies log.

`POST /api/ws-ticket/` (token authentication) answers a random ticket, valid for WS_TICKET_SECONDS (default 30)
and for ONE connection: the client opens the socket with `?ticket=<ticket>`. Redis holds the ticket's SHA-256
digest (never the ticket) with the user and the token's row it was issued against; taking it (GETDEL) is atomic,
so a ticket replayed, even at the same moment from two places, opens one socket at most. A socket opened with a
ticket is checked again, as a session's is, every WS_SESSION_RECHECK_SECONDS: it closes once its token is revoked
or expired or its user deactivated (docs/realtime.md).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings

TICKET_BYTES = 32
TICKET_MAX_CHARS = 100  # a ticket is 43 characters; anything longer is not one (refused before any lookup)

_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class TicketGrant:
    """What a taken ticket stands for: the user, and the token row (its digest) whose holder asked for it."""

    user_id: int
    token_digest: str


def ticket_seconds() -> int:
    return max(1, int(getattr(settings, "WS_TICKET_SECONDS", 30)))


def ticket_issue(*, user_id: int, token_digest: str) -> str:
    ticket = secrets.token_urlsafe(TICKET_BYTES)
    record = json.dumps({"user": user_id, "token": token_digest})
    _client().set(_key(ticket), record, ex=ticket_seconds())
    return ticket


def ticket_take(ticket: str) -> TicketGrant | None:
    """The ticket's grant, once: None when it is unknown, used or expired (or not a ticket's shape)."""
    if not ticket or len(ticket) > TICKET_MAX_CHARS:
        return None
    raw = _client().getdel(_key(ticket))
    if raw is None:
        return None
    record = json.loads(raw)
    return TicketGrant(user_id=int(record["user"]), token_digest=str(record["token"]))


def grant_user(grant: TicketGrant) -> Any:
    """The grant's user as it is now, or None: the token row must still exist, unexpired, for an active user."""
    from knox.models import AuthToken

    from runs.auth.tokens import token_expired

    row = AuthToken.objects.filter(digest=grant.token_digest, user_id=grant.user_id).select_related("user").first()
    if row is None or token_expired(row) or not row.user.is_active:
        return None
    return row.user


def _key(ticket: str) -> str:
    layer: dict[str, Any] = settings.CHANNEL_LAYERS["default"]
    prefix = layer.get("CONFIG", {}).get("prefix", "asgi")
    return f"{prefix}:ws:ticket:{hashlib.sha256(ticket.encode()).hexdigest()}"


def _client() -> redis.Redis:
    with _lock:
        if settings.REDIS_URL not in _clients:
            _clients[settings.REDIS_URL] = redis.Redis.from_url(
                settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=5
            )
        return _clients[settings.REDIS_URL]
