"""Websocket URL map (Channels): the dashboard and one run's event stream (docs/realtime.md)."""

from django.urls import path

from frontend.consumers import DashboardConsumer, RunConsumer

websocket_urlpatterns: list = [
    path("ws/dashboard/", DashboardConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
]
