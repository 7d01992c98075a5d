"""`/api/auth/token/`: POST exchanges username + password for a new API token (sign-in limited: 429 with
Retry-After while this username from this address, or this address, has too many recent failures,
runs.auth.auth_limit); DELETE revokes the caller's token. Tokens are hashed at rest and expire (runs/auth/tokens.py)."""

from __future__ import annotations

from typing import Any, NoReturn

from django.contrib.auth import authenticate
from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.signals import user_logged_in
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status as http
from rest_framework.exceptions import APIException
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle

from runs.api import serializers as s
from runs.api.views import ServiceView, _body
from runs.audit.record import Actor, actor_from_request
from runs.auth.auth_limit import signin_wait
from runs.auth.tokens import token_issue, token_revoke
from runs.errors import InvalidInput


class SignInThrottled(APIException):
    status_code = 429

    def __init__(self, wait: int) -> None:
        self.wait = wait  # DRF's handler sends it as Retry-After
        super().__init__(
            detail={
                "detail": f"too many failed sign-ins for this username from this address; try again in {wait} s",
                "field": None,
            }
        )


class SignInThrottle(BaseThrottle):
    """429 while the posted username from this client address, or the address, has too many recent failures."""

    def allow_request(self, request: Request, view: Any) -> bool:
        username = request.data.get("username") if isinstance(request.data, dict) else None
        self._wait = signin_wait(request._request, username if isinstance(username, str) else None)
        return not self._wait

    def wait(self) -> float | None:
        return self._wait


class TokenView(ServiceView):
    """POST: exchange username and password for a new API token (`Authorization: Token <token>`).
    DELETE: revoke the caller's token (authenticated by that token), or all the user's tokens (by a session)."""

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
        # As knox's own login view does: last_login, and axes clears this (username, address)'s failures.
        user_logged_in.send(sender=user.__class__, request=request._request, user=user)
        actor = Actor(user_id=user.pk, name=user.get_username(), request_id=getattr(request, "request_id", ""))
        return Response({"token": token_issue(user, actor=actor)})

    @extend_schema(
        operation_id="auth_token_revoke",
        request=None,
        responses={
            204: OpenApiResponse(
                description="the token the request came with is deleted (by a session: all the user's)"
            )
        },
    )
    def delete(self, request: Request) -> Response:
        user = request.user
        assert not isinstance(user, AnonymousUser)  # get_permissions: IsAuthenticated for everything but POST
        token_revoke(
            user, request.auth, actor=actor_from_request(request)
        )  # request.auth: the knox row for a token, None for a session
        return Response(status=http.HTTP_204_NO_CONTENT)
