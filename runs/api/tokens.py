"""API token authentication (django-rest-knox: tokens hashed at rest; lifetime rules in runs/auth/tokens.py). Loaded by
DRF's settings (the authentication class), so this module must not import rest_framework.views.

A token presented in `Authorization: Token <key>` that is unknown or revoked, or expired, answers 401 with
`WWW-Authenticate: Token` and a message saying which (an expired token is deleted when presented); requests
without credentials keep DRF's 403 (session authentication comes first).
"""

from __future__ import annotations

import binascii
from hmac import compare_digest
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from knox.auth import TokenAuthentication
from knox.crypto import hash_token
from knox.models import get_token_model
from knox.settings import CONSTANTS
from rest_framework.exceptions import APIException, AuthenticationFailed
from rest_framework.request import Request

from runs.auth.tokens import token_expired

__all__ = ["HashedTokenAuthentication", "HashedTokenScheme", "TokenRefused"]

UNKNOWN = "Invalid token. (it may have been revoked); get one with POST /api/auth/token/"
EXPIRED = "token expired; get a new one with POST /api/auth/token/"


class TokenRefused(APIException):
    """401 for a presented token that is not (or no longer) valid; DRF would turn AuthenticationFailed into 403
    because session authentication, listed first, has no WWW-Authenticate challenge."""

    status_code = 401
    auth_header = "Token"

    def __init__(self, message: str) -> None:
        super().__init__(detail={"detail": message, "field": None})


class HashedTokenAuthentication(TokenAuthentication):
    """knox's token authentication, saying whether a refused token was unknown/revoked or expired."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        try:
            return super().authenticate(request)
        except AuthenticationFailed as exc:  # a malformed header, or knox's refusals
            raise TokenRefused(f"{exc.detail}; get one with POST /api/auth/token/") from exc

    def authenticate_credentials(self, token: bytes) -> tuple[Any, Any]:
        """knox's lookup (by the first 15 characters, then the digest in constant time), except that expiry is
        checked after the match, so an expired token is told apart from an unknown one."""
        try:
            key = token.decode("ascii")
            digest = hash_token(key)
        except (UnicodeDecodeError, TypeError, binascii.Error):
            raise TokenRefused(UNKNOWN) from None
        rows = get_token_model().objects.filter(token_key=key[: CONSTANTS.TOKEN_KEY_LENGTH]).select_related("user")
        for row in rows:
            if compare_digest(digest, row.digest):
                if token_expired(row):
                    row.delete()
                    raise TokenRefused(EXPIRED)
                if not row.user.is_active:
                    raise TokenRefused("User inactive or deleted.")
                return row.user, row
        raise TokenRefused(UNKNOWN)


class HashedTokenScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of `Authorization: Token <key>`, as drf-spectacular wrote it for DRF's tokens."""

    target_class = "runs.api.tokens.HashedTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict:
        return build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Token")
