"""REST API routes under /api/."""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import IsAuthenticated

from runs.api import views
from runs.api.audit import AuditListView
from runs.api.auth import TokenView
from runs.api.compare import RunCompareView
from runs.api.concurrency import ConcurrencySettingsView
from runs.api.controls import RunGateResetView
from runs.api.ingest import RunIngestView
from runs.api.priority import RunPriorityView
from runs.api.proxy import run_proxy
from runs.api.samples import RunSampleDetailView, RunSamplesView
from runs.api.schedules import ScheduleDetailView, ScheduleListCreateView
from runs.api.trace import RunTraceView
from runs.api.webhooks import WebhookDeliveriesView, WebhookDetailView, WebhookListCreateView, WebhookTestView
from runs.api.ws_ticket import WsTicketView

urlpatterns = [
    path("runs/", views.RunListCreateView.as_view(), name="api-runs"),
    path("runs/resources/", views.RunResourcesView.as_view(), name="api-runs-resources"),
    path("runs/compare/", RunCompareView.as_view(), name="api-runs-compare"),
    path("runs/<int:run_id>/", views.RunDetailView.as_view(), name="api-run"),
    path("runs/<int:run_id>/cancel/", views.RunCancelView.as_view(), name="api-run-cancel"),
    path("runs/<int:run_id>/resume/", views.RunResumeView.as_view(), name="api-run-resume"),
    path("runs/<int:run_id>/gate-reset/", RunGateResetView.as_view(), name="api-run-gate-reset"),
    path("runs/<int:run_id>/events/", views.RunEventsView.as_view(), name="api-run-events"),
    path("runs/<int:run_id>/ingest/", RunIngestView.as_view(), name="api-run-ingest"),
    # The run's session server, proxied (async; not a DRF view, so not in the OpenAPI schema: docs/api.md).
    path("runs/<int:run_id>/v1/<path:path>", run_proxy, name="api-run-proxy"),
    path("runs/<int:run_id>/samples/", RunSamplesView.as_view(), name="api-run-samples"),
    path("runs/<int:run_id>/samples/<int:sample_id>/", RunSampleDetailView.as_view(), name="api-run-sample"),
    path("runs/<int:run_id>/trace/", RunTraceView.as_view(), name="api-run-trace"),
    path("runs/<int:run_id>/priority/", RunPriorityView.as_view(), name="api-run-priority"),
    path("slots/", views.SlotsView.as_view(), name="api-slots"),
    path("slots/dry-run/", views.SlotDryRunView.as_view(), name="api-slots-dry-run"),
    path("settings/concurrency/", ConcurrencySettingsView.as_view(), name="api-settings-concurrency"),
    path("schedules/", ScheduleListCreateView.as_view(), name="api-schedules"),
    path("schedules/<int:schedule_id>/", ScheduleDetailView.as_view(), name="api-schedule"),
    path("audit/", AuditListView.as_view(), name="api-audit"),
    path("webhooks/", WebhookListCreateView.as_view(), name="api-webhooks"),
    path("webhooks/<int:webhook_id>/", WebhookDetailView.as_view(), name="api-webhook"),
    path("webhooks/<int:webhook_id>/test/", WebhookTestView.as_view(), name="api-webhook-test"),
    path("webhooks/<int:webhook_id>/deliveries/", WebhookDeliveriesView.as_view(), name="api-webhook-deliveries"),
    path("auth/token/", TokenView.as_view(), name="api-token"),
    path("ws-ticket/", WsTicketView.as_view(), name="api-ws-ticket"),
    path("schema/", SpectacularAPIView.as_view(permission_classes=[IsAuthenticated]), name="api-schema"),
]
