"""API token lifetime: tokens expire API_TOKEN_MAX_AGE_SECONDS after they were issued (and are deleted when
presented after that), `token_issue` replaces an expired one (both in runs/tokens.py). Loaded by DRF's
settings (the authentication class), so this module must not import rest_framework.views.

A token presented in `Authorization: Token <key>` that is unknown, revoked or expired answers 401 with
`WWW-Authenticate: Token` and a message saying which; requests without credentials keep DRF's 403
(session authentication comes first).
"""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import APIException, AuthenticationFailed

from runs.tokens import token_expired, token_issue

__all__ = ["ExpiringTokenAuthentication", "TokenRefused", "token_expired", "token_issue"]


class TokenRefused(APIException):
    """401 for a presented token that is not (or no longer) valid; DRF would turn AuthenticationFailed into 403
    because session authentication, listed first, has no WWW-Authenticate challenge."""

    status_code = 401
    auth_header = "Token"

    def __init__(self, message: str) -> None:
        super().__init__(detail={"detail": message, "field": None})


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
