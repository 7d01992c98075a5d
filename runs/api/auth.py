"""`/api/auth/token/`: POST exchanges username + password for an API token (sign-in limited: 429 while the
username or the client address has too many recent failures, runs.auth_limit); DELETE revokes the caller's
token. Expiry is enforced by runs.api.tokens."""

from __future__ import annotations

from typing import Any, NoReturn

from django.contrib.auth import authenticate
from django.contrib.auth.models import AnonymousUser
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status as http
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import APIException
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle

from runs.api import serializers as s
from runs.api.tokens import token_issue
from runs.api.views import ServiceView, _body
from runs.auth_limit import client_ip, signin_wait
from runs.errors import InvalidInput


class SignInThrottled(APIException):
    status_code = 429

    def __init__(self, wait: int) -> None:
        self.wait = wait  # DRF's handler sends it as Retry-After
        super().__init__(
            detail={
                "detail": f"too many failed sign-ins for this username or address; try again in {wait} s",
                "field": None,
            }
        )


class SignInThrottle(BaseThrottle):
    """429 while the posted username or the client address has too many recent failed sign-ins."""

    def allow_request(self, request: Request, view: Any) -> bool:
        username = request.data.get("username") if isinstance(request.data, dict) else None
        self._wait = signin_wait(username if isinstance(username, str) else None, client_ip(request))
        return not self._wait

    def wait(self) -> float | None:
        return self._wait


class TokenView(ServiceView):
    """POST: exchange username and password for an API token (`Authorization: Token <token>`).
    DELETE: revoke the caller's token (authenticated by that token or by a session)."""

    def _posting(self) -> bool:
        return getattr(getattr(self, "request", None), "method", None) == "POST"

    def get_authenticators(self) -> list:
        # POST takes credentials in its body: no session (so no CSRF) and no token header is consulted.
        return [] if self._posting() else super().get_authenticators()

    def get_permissions(self) -> list:
        return [AllowAny()] if self._posting() else [IsAuthenticated()]

    def get_throttles(self) -> list:
        return [SignInThrottle()] if self._posting() else []

    def throttled(self, request: Request, wait: float | None) -> NoReturn:
        raise SignInThrottled(int(wait or 1))

    @extend_schema(
        operation_id="auth_token",
        request=s.TokenInputSerializer,
        responses={
            200: s.TokenSerializer,
            400: OpenApiResponse(s.ErrorSerializer),
            429: OpenApiResponse(s.ErrorSerializer, description="too many failed sign-ins"),
        },
        auth=[],
    )
    def post(self, request: Request) -> Response:
        body = s.TokenInputSerializer(data=_body(request))
        body.is_valid(raise_exception=True)
        user = authenticate(
            request=request._request, username=body.validated_data["username"], password=body.validated_data["password"]
        )
        if user is None or not user.is_active:
            raise InvalidInput("wrong username or password", field="password")
        return Response({"token": token_issue(user).key})

    @extend_schema(
        operation_id="auth_token_revoke",
        request=None,
        responses={204: OpenApiResponse(description="the caller's token is deleted (if it had one)")},
    )
    def delete(self, request: Request) -> Response:
        user = request.user
        assert not isinstance(user, AnonymousUser)  # get_permissions: IsAuthenticated for everything but POST
        Token.objects.filter(user=user).delete()
        return Response(status=http.HTTP_204_NO_CONTENT)
