"""Dashboard pages."""

from django.urls import path

from frontend.views import audit, auth, compare, dashboard, metrics, samples, settings, webhooks

urlpatterns: list = [
    path("", dashboard.board, name="board"),
    path("runs/new/", dashboard.run_submit_form, name="run-submit"),
    path("runs/<int:run_id>/", dashboard.run_detail, name="run-detail"),
    path("compare/", compare.compare, name="compare"),
    path("runs/<int:run_id>/samples/", samples.run_samples, name="run-samples"),
    path("login/", auth.login_view, name="login"),
    path("logout/", auth.logout_view, name="logout"),
    path("settings/", settings.concurrency_settings, name="settings"),
    path("audit/", audit.audit_log, name="audit"),
    path("webhooks/", webhooks.webhooks_page, name="webhooks"),
    path("webhooks/<int:webhook_id>/test/", webhooks.webhook_send_test, name="webhook-send-test"),
    path("metrics", metrics.metrics, name="metrics"),
]
