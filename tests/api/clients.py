"""Clients and a submit of the REST API tests (test_api_runs.py, test_api_slots.py, test_compare.py): the
fields of a run's JSON, an authenticated or anonymous client, a browser-like session client, and a run posted."""

from __future__ import annotations

from rest_framework.test import APIClient

from tests.runs.helpers import TEST_KIND

RUN_FIELDS = {
    "id",
    "pending_detail",
    "resources",
    "preempted_by",  # its latest preemption (docs/slots.md "Preemption")
    "preempt_state",
    "preempt_reason",
    "name",
    "origin",
    "run_class",
    "kind",
    "status",
    "owner",
    "cancelled_by",  # REST only (the audit log); websocket frames do not carry it
    "resumed_by",
    "config",
    "created_at",
    "granted_at",
    "started_at",
    "finished_at",
    "queued_seconds",
    "position",
    "pending_reason",
    "eta_seconds",
    "progress",
    "eta_finish_seconds",
    "error",
    "summary",
    "auto_resume",
    "time_limit_seconds",
}


def client_for(user=None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def session_for(user) -> APIClient:
    """A browser-like client (session cookie): its submits earn origin `dashboard`."""
    client = APIClient()
    client.force_login(user)
    return client


def post_run(client, **body):
    return client.post(
        "/api/runs/", {"name": "r", "origin": "api", "kind": TEST_KIND, "config": {"steps": 2}} | body, format="json"
    )
