"""Websocket authentication by ticket (runs/auth/ws_tickets.py), in front of the session stack of config/asgi.py.

A connection whose query string has `ticket` is a script's: the ticket is taken (once) and its user set on the
scope, or AnonymousUser when the ticket is unknown, used, expired or its token no longer valid, and the consumer
closes it with 4401 as it does any unauthenticated socket. It skips the session middleware (the cookie is not
what authenticates it) and the Origin check: that check stops another site's page from opening a socket with the
browser's ambient cookie, and a ticket is not ambient (a page must hold it, and it opens one socket). Any other
connection goes through the session stack, Origin check included, exactly as before.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser

from runs.auth.ws_tickets import TicketGrant, grant_user, ticket_take


def _ticket_user(ticket: str) -> tuple[Any, TicketGrant | None]:
    grant = ticket_take(ticket)
    user = grant_user(grant) if grant is not None else None
    return (user, grant) if user is not None else (AnonymousUser(), None)


class TicketOrSession:
    """ASGI router: `?ticket=` connections to `by_ticket` with the ticket's user, all others to `by_session`."""

    def __init__(self, *, by_ticket: Any, by_session: Any) -> None:
        self.by_ticket = by_ticket
        self.by_session = by_session

    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        if "ticket" not in query:
            return await self.by_session(scope, receive, send)
        user, grant = await database_sync_to_async(_ticket_user)(query["ticket"][0])
        return await self.by_ticket({**scope, "user": user, "ws_ticket": grant}, receive, send)
