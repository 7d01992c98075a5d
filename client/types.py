"""The shapes the client reads, as the API answers them (the OpenAPI schema's `Run` and `RunEvent`). Only the
fields the client and its CLI use are declared; tests/api/test_client_schema.py checks each against /api/schema/,
so a field the API drops fails a test instead of a user's script."""

from __future__ import annotations

from typing import Any, TypedDict


class Run(TypedDict):
    id: int
    name: str
    kind: str
    status: str
    run_class: str
    owner: str
    position: dict[str, int] | None  # {in_class, overall} while queued
    pending_reason: str | None
    eta_seconds: float | None
    eta_finish_seconds: float | None
    error: str
    summary: dict[str, Any]
    created_at: str


class Event(TypedDict):
    run: int
    seq: int
    ts: float
    type: str
    data: dict[str, Any]


PATHS = (  # the endpoints the client calls (checked against the schema's paths)
    "/api/runs/",
    "/api/runs/{run_id}/",
    "/api/runs/{run_id}/cancel/",
    "/api/runs/{run_id}/resume/",
    "/api/runs/{run_id}/events/",
    "/api/runs/{run_id}/priority/",
    "/api/slots/",
    "/api/slots/dry-run/",
    "/api/settings/concurrency/",
    "/api/ws-ticket/",
)
