"""API token lifetime: tokens expire API_TOKEN_MAX_AGE_SECONDS after they were issued (and are deleted when
presented after that), `token_issue` replaces an expired one. Loaded by DRF's settings (the authentication class),
so this module must not import rest_framework.views.

A token presented in `Authorization: Token <key>` that is unknown, revoked or expired answers 401 with
`WWW-Authenticate: Token` and a message saying which; requests without credentials keep DRF's 403
(session authentication comes first).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import APIException, AuthenticationFailed


class TokenRefused(APIException):
    """401 for a presented token that is not (or no longer) valid; DRF would turn AuthenticationFailed into 403
    because session authentication, listed first, has no WWW-Authenticate challenge."""

    status_code = 401
    auth_header = "Token"

    def __init__(self, message: str) -> None:
        super().__init__(detail={"detail": message, "field": None})


def token_expired(token: Any) -> bool:
    return token.created + timedelta(seconds=settings.API_TOKEN_MAX_AGE_SECONDS) <= timezone.now()


def token_issue(user: Any) -> Any:
    """The user's valid token: the current one, or a fresh one when there is none or it has expired."""
    from rest_framework.authtoken.models import Token  # late: DRF loads this module before apps are ready

    with transaction.atomic():
        token = Token.objects.select_for_update().filter(user=user).first()
        if token is not None and token_expired(token):
            token.delete()
            token = None
        return token or Token.objects.create(user=user)


class ExpiringTokenAuthentication(TokenAuthentication):
    """DRF token authentication whose tokens expire API_TOKEN_MAX_AGE_SECONDS after they were issued."""

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        try:
            user, token = super().authenticate_credentials(key)
        except AuthenticationFailed as exc:
            raise TokenRefused(f"{exc.detail} (it may have been revoked); get one with POST /api/auth/token/") from exc
        if token_expired(token):
            token.delete()
            raise TokenRefused("token expired; get a new one with POST /api/auth/token/")
        return user, token
