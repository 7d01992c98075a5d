"""`/api/settings/concurrency/`: the staff's view and edit of the concurrency settings (class limits, the
reserve, the per-user caps, the fairness, preemption and team quota options; docs/slots.md). Each change goes through
runs.scheduling.concurrency.settings_update, audited with the caller as actor."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response

from runs.api import serializers as s
from runs.api import serializers_settings as ss
from runs.api.views import ServiceView, _body
from runs.audit.record import actor_from_request
from runs.scheduling import limits
from runs.scheduling.concurrency import settings_update
from runs.slots import store


class ConcurrencySettingsView(ServiceView):
    permission_classes = [IsAdminUser]

    def _effective(self) -> Response:
        policy = store.policy_load(fresh=True)
        out: dict[str, Any] = {**policy.to_dict(), **limits.limits_load().to_dict()}
        for name, item in out["classes"].items():
            item.update(policy.fairness.of(name).to_dict())
            rules = policy.preemption.of(name)
            item.update(preemptible=rules.preemptible, preempts=rules.preempts)
            quotas = policy.quotas.of(name)
            item["team_quotas"] = dict(quotas.quotas) if quotas else {}
            item["team_borrowing_limit"] = quotas.borrowing_limit if quotas else None
        out["fair_share_half_life_seconds"] = policy.fairness.half_life_seconds
        out["user_weights"] = {str(k): v for k, v in policy.fairness.user_weights.items()}
        out.update(policy.preemption.to_dict())
        return Response(out)

    @extend_schema(
        operation_id="settings_concurrency_retrieve",
        responses={200: ss.ConcurrencySettingsSerializer, 403: s.ErrorSerializer},
    )
    def get(self, request: Request) -> Response:
        return self._effective()

    @extend_schema(
        operation_id="settings_concurrency_partial_update",
        request=ss.ConcurrencySettingsInputSerializer,
        responses={200: ss.ConcurrencySettingsSerializer, 400: s.ErrorSerializer, 403: s.ErrorSerializer},
    )
    def patch(self, request: Request) -> Response:
        settings_update(changes=_body(request), partial=True, by=request.user, actor=actor_from_request(request))
        return self._effective()

    @extend_schema(
        operation_id="settings_concurrency_update",
        request=ss.ConcurrencySettingsInputSerializer,
        responses={200: ss.ConcurrencySettingsSerializer, 400: s.ErrorSerializer, 403: s.ErrorSerializer},
    )
    def put(self, request: Request) -> Response:
        settings_update(changes=_body(request), partial=False, by=request.user, actor=actor_from_request(request))
        return self._effective()
