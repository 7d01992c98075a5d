"""The webhook API: `GET/POST /api/webhooks/`, `GET/PATCH/DELETE /api/webhooks/<id>/`, `POST
/api/webhooks/<id>/test/` (send a test delivery) and `GET /api/webhooks/<id>/deliveries/` (the delivery log).
Each user sees only their own subscriptions (another's reads as 404, staff included); throttled per user (scope
`webhooks`). Writes: runs/webhooks/subscriptions.py. docs/api.md, "Webhooks"."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework import status as http
from rest_framework.request import Request
from rest_framework.response import Response

from runs.api.serializers import ErrorSerializer
from runs.api.throttles import HeavyReadThrottle, throttled_response
from runs.api.views import ServiceView, _body
from runs.core.visibility import visible_runs
from runs.errors import RunNotFound
from runs.webhooks import subscriptions
from runs.webhooks.models import Delivery, Subscription

ERRORS = {400: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer, **throttled_response()}
WEBHOOK_ID = OpenApiParameter("webhook_id", int, OpenApiParameter.PATH, description="subscription id")
DELIVERIES_SHOWN = 50


class RuleSerializer(serializers.Serializer):
    metric = serializers.ChoiceField(choices=["reward_mean", "exact_match"])
    op = serializers.ChoiceField(choices=["above", "below", "drop"])
    threshold = serializers.FloatField(help_text="above/below: the value; drop: the fraction (0.2 = 20 %)")
    window = serializers.IntegerField(required=False, help_text="drop: the last N train events compared")


class SubscriptionSerializer(serializers.ModelSerializer):
    events = serializers.ListField(child=serializers.CharField())
    rules = RuleSerializer(many=True, read_only=True)

    class Meta:
        model = Subscription
        fields = ["id", "url", "events", "run", "all_runs", "allow_private", "active", "rules", "created_at"]
        read_only_fields = fields


class SubscriptionCreatedSerializer(SubscriptionSerializer):
    secret = serializers.CharField(read_only=True, help_text="the signing key; shown only in this answer")

    class Meta(SubscriptionSerializer.Meta):
        fields = [*SubscriptionSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class SubscriptionCreateSerializer(serializers.Serializer):
    # Plain fields: runs/webhooks/subscriptions.py validates them, so that the 400 names the field exactly.
    url = serializers.CharField(max_length=2048)
    events = serializers.ListField(child=serializers.CharField(), help_text="run.status, run.gate_poisoned, ...")
    run = serializers.IntegerField(required=False, allow_null=True, help_text="one of your runs (default: all)")
    all_runs = serializers.BooleanField(required=False, help_text="staff only: every user's runs")
    allow_private = serializers.BooleanField(required=False, help_text="staff only: allow a private target")
    rules = RuleSerializer(many=True, required=False)


class AttemptSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    status_code = serializers.IntegerField(allow_null=True)
    error = serializers.CharField()
    latency_ms = serializers.FloatField()


class DeliverySerializer(serializers.ModelSerializer):
    attempt_log = AttemptSerializer(many=True, read_only=True)

    class Meta:
        model = Delivery
        fields = ["id", "event", "run", "at", "state", "attempts", "delivered_at", "attempt_log"]
        read_only_fields = fields


def _mine(request: Request, webhook_id: int) -> Subscription:
    sub = Subscription.objects.select_related("owner").filter(pk=webhook_id, owner_id=request.user.pk).first()
    if sub is None:
        raise RunNotFound(f"webhook {webhook_id} does not exist", field="webhook_id")
    return sub


class WebhookView(ServiceView):
    throttle_classes = [HeavyReadThrottle]
    throttle_scope = "webhooks"


class WebhookListCreateView(WebhookView):
    @extend_schema(operation_id="webhooks_list", responses={200: SubscriptionSerializer(many=True), **ERRORS})
    def get(self, request: Request) -> Response:
        rows = Subscription.objects.filter(owner_id=request.user.pk).prefetch_related("rules")
        return Response(SubscriptionSerializer(rows, many=True).data)

    @extend_schema(
        operation_id="webhooks_create",
        request=SubscriptionCreateSerializer,
        responses={201: SubscriptionCreatedSerializer, 429: ErrorSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        sub = subscriptions.subscription_create(
            user=request.user, body=_body(request), visible=visible_runs(request.user)
        )
        return Response(SubscriptionCreatedSerializer(sub).data, status=http.HTTP_201_CREATED)


class WebhookDetailView(WebhookView):
    @extend_schema(
        operation_id="webhooks_retrieve", parameters=[WEBHOOK_ID], responses={200: SubscriptionSerializer, **ERRORS}
    )
    def get(self, request: Request, webhook_id: int) -> Response:
        return Response(SubscriptionSerializer(_mine(request, webhook_id)).data)

    @extend_schema(
        operation_id="webhooks_update",
        parameters=[WEBHOOK_ID],
        request=SubscriptionCreateSerializer(partial=True),
        responses={200: SubscriptionSerializer, **ERRORS},
    )
    def patch(self, request: Request, webhook_id: int) -> Response:
        sub = subscriptions.subscription_update(sub=_mine(request, webhook_id), body=_body(request))
        return Response(SubscriptionSerializer(sub).data)

    @extend_schema(operation_id="webhooks_destroy", parameters=[WEBHOOK_ID], responses={204: None, **ERRORS})
    def delete(self, request: Request, webhook_id: int) -> Response:
        _mine(request, webhook_id).delete()
        return Response(status=http.HTTP_204_NO_CONTENT)


class WebhookTestView(WebhookView):
    @extend_schema(
        operation_id="webhooks_test",
        parameters=[WEBHOOK_ID],
        request=None,
        responses={202: DeliverySerializer, **ERRORS},
    )
    def post(self, request: Request, webhook_id: int) -> Response:
        delivery = subscriptions.test_send(_mine(request, webhook_id))
        return Response(DeliverySerializer(delivery).data, status=http.HTTP_202_ACCEPTED)


class WebhookDeliveriesView(WebhookView):
    @extend_schema(
        operation_id="webhooks_deliveries",
        parameters=[WEBHOOK_ID],
        responses={200: DeliverySerializer(many=True), **ERRORS},
        description=f"the latest {DELIVERIES_SHOWN} deliveries, newest first, each with its attempts",
    )
    def get(self, request: Request, webhook_id: int) -> Response:
        sub = _mine(request, webhook_id)
        rows = sub.deliveries.prefetch_related("attempt_log")[:DELIVERIES_SHOWN]
        return Response(DeliverySerializer(rows, many=True).data)
