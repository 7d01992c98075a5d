"""Who acts (`Actor`, threaded explicitly from the request or named `platform`) and `audit_record`, which the
single writer of each change calls inside its transaction, so a row exists exactly when the change committed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from runs.audit.models import PLATFORM, AuditEntry

TOKEN_PREFIX_LENGTH = 8  # of knox's token_key (its first 15 characters): enough to tell tokens apart, not to use


@dataclass(frozen=True)
class Actor:
    """A user (with the prefix of the API token the call came with, if any) or the platform itself."""

    user_id: int | None
    name: str
    token: str = ""
    request_id: str = ""

    @property
    def is_platform(self) -> bool:
        return self.user_id is None


PLATFORM_ACTOR = Actor(user_id=None, name=PLATFORM)


def actor_of(by: Any) -> Actor:
    """An Actor as is; a user as that user (no token, no request); anything else (e.g. "the platform
    (auto-resume)") as the platform."""
    if isinstance(by, Actor):
        return by
    if getattr(by, "pk", None) is not None and hasattr(by, "get_username"):
        return Actor(user_id=by.pk, name=by.get_username())
    return PLATFORM_ACTOR


def actor_from_request(request: Any) -> Actor:
    """The user of an authenticated request, the prefix of its knox token (request.auth) when it came with one,
    and the request id the middleware gave it."""
    user = request.user
    token_key = getattr(getattr(request, "auth", None), "token_key", "") or ""
    return Actor(
        user_id=user.pk,
        name=user.get_username(),
        token=str(token_key)[:TOKEN_PREFIX_LENGTH],
        request_id=getattr(request, "request_id", "") or "",
    )


def audit_record(
    actor: Actor,
    action: str,
    *,
    target_type: str,
    target_id: Any,
    before: Any = None,
    after: Any = None,
) -> AuditEntry:
    """Append one row; the caller's transaction makes it commit or roll back with the change it describes."""
    if not connection.in_atomic_block:
        raise RuntimeError("audit_record must run inside the transaction of the change it records")
    return AuditEntry.objects.create(
        actor_user_id=actor.user_id,
        actor_name=actor.name[:150],
        actor_token=actor.token,
        action=action,
        target_type=target_type,
        target_id=str(target_id),
        request_id=actor.request_id,
        before=before,
        after=after,
    )
