"""`POST /api/ws-ticket/`: a one-connection websocket ticket for a token-authenticated client
(runs/auth/ws_tickets.py; docs/realtime.md, "Tokens")."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework import status as http
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from runs.api.serializers import ErrorSerializer
from runs.api.throttles import HeavyReadThrottle
from runs.api.tokens import HashedTokenAuthentication
from runs.auth.ws_tickets import ticket_issue, ticket_seconds


class WsTicketSerializer(serializers.Serializer):
    ticket = serializers.CharField(help_text="open /ws/runs/<id>/ or /ws/dashboard/ with ?ticket=<ticket>, once")
    expires_in = serializers.IntegerField(help_text="seconds the ticket stays valid if unused")


class WsTicketView(APIView):
    """Token authentication only: a browser session opens websockets with its cookie, no ticket needed."""

    authentication_classes = [HashedTokenAuthentication]
    throttle_classes = [HeavyReadThrottle]
    throttle_scope = "ws_ticket"

    @extend_schema(
        operation_id="ws_ticket_create",
        request=None,
        responses={
            201: WsTicketSerializer,
            401: OpenApiResponse(ErrorSerializer, description="no API token (a browser session needs no ticket)"),
            429: ErrorSerializer,
        },
    )
    def post(self, request: Request) -> Response:
        token: Any = request.auth  # the knox row: this view authenticates by token only
        ticket = ticket_issue(user_id=token.user_id, token_digest=token.digest)
        return Response({"ticket": ticket, "expires_in": ticket_seconds()}, status=http.HTTP_201_CREATED)
