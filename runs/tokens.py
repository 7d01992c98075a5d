"""API token lifetime (core, no HTTP): a token expires API_TOKEN_MAX_AGE_SECONDS after it was issued, and
`token_issue` replaces an expired one. Used by the API (runs/api/tokens.py, runs/api/auth.py) and by the
`platform_admin` command; the HTTP side (401 answers) stays in runs/api/tokens.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone


def token_expired(token: Any) -> bool:
    return token.created + timedelta(seconds=settings.API_TOKEN_MAX_AGE_SECONDS) <= timezone.now()


def token_issue(user: Any) -> Any:
    """The user's valid token: the current one, or a fresh one when there is none or it has expired."""
    from rest_framework.authtoken.models import Token  # late: needs the apps ready

    with transaction.atomic():
        token = Token.objects.select_for_update().filter(user=user).first()
        if token is not None and token_expired(token):
            token.delete()
            token = None
        return token or Token.objects.create(user=user)
