"""API tokens (core, no HTTP), on django-rest-knox: only a SHA-512 digest of each token is stored (and its first
15 characters, to find the row), so the database holds no usable token. A token expires API_TOKEN_MAX_AGE_SECONDS
after it was issued (knox's `expiry`, set at issue; a shorter setting applies at once to older tokens too).
Each sign-in issues a new token (the value of an earlier one cannot be shown again); a user keeps at most
API_TOKENS_PER_USER, the oldest going first. Used by the API (runs/api/tokens.py, runs/api/auth.py) and by the
`platform_admin` command; the HTTP side (401 answers) stays in runs/api/tokens.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runs.audit.models import Action
from runs.audit.record import TOKEN_PREFIX_LENGTH, Actor, actor_of, audit_record


def token_expired(token: Any) -> bool:
    now = timezone.now()
    past_expiry = token.expiry is not None and token.expiry <= now
    return past_expiry or token.created + timedelta(seconds=settings.API_TOKEN_MAX_AGE_SECONDS) <= now


def token_issue(user: Any, actor: Actor | None = None) -> str:
    """A new token for `user` (its value: the only time it exists outside the client). The user's expired tokens,
    and the oldest past API_TOKENS_PER_USER, are deleted. Audited (target: the new token's prefix) as `actor`."""
    from knox.models import AuthToken  # late: needs the apps ready

    with transaction.atomic():
        mine = AuthToken.objects.select_for_update().filter(user=user).order_by("-created")
        stale = [t.digest for t in mine if token_expired(t)]
        keep = [t.digest for t in mine if t.digest not in stale][: max(settings.API_TOKENS_PER_USER - 1, 0)]
        AuthToken.objects.filter(user=user).exclude(digest__in=keep).delete()
        row, key = AuthToken.objects.create(user=user, expiry=timedelta(seconds=settings.API_TOKEN_MAX_AGE_SECONDS))
        prefix = row.token_key[:TOKEN_PREFIX_LENGTH]
        audit_record(actor or actor_of(user), Action.TOKEN_CREATE, target_type="token", target_id=prefix)
    return key


def token_revoke(user: Any, token: Any = None, actor: Actor | None = None) -> int:
    """Delete `token` (the one a request came with), or all of the user's tokens when none is given (a session's
    DELETE). Returns how many were deleted; audited (one row per call, naming the revoked prefixes) when any was."""
    from knox.models import AuthToken

    with transaction.atomic():
        rows = AuthToken.objects.select_for_update().filter(user=user)
        if token is not None:
            rows = rows.filter(digest=token.digest)
        prefixes = sorted(t.token_key[:TOKEN_PREFIX_LENGTH] for t in rows)
        deleted, _ = rows.delete()
        if prefixes:
            target = prefixes[0] if len(prefixes) == 1 else f"user:{user.pk}"
            before = {"tokens": prefixes}
            audit_record(
                actor or actor_of(user), Action.TOKEN_REVOKE, target_type="token", target_id=target, before=before
            )
    return deleted
