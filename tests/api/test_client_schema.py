"""The Python client (client/) cannot drift from the API: every endpoint it calls and every field it reads of a
run or an event is in /api/schema/, and the idempotency and ticket contracts it relies on are documented there.
Removing a field from RunSerializer, or an endpoint from the URLs, fails this test."""

from __future__ import annotations

from typing import get_type_hints

import pytest

from client.types import PATHS, Event, Run
from tests.api.clients import client_for

pytestmark = pytest.mark.django_db


def schema(user) -> dict:
    return client_for(user).get("/api/schema/", {"format": "json"}).json()


def component(doc: dict, name: str) -> set[str]:
    return set(doc["components"]["schemas"][name]["properties"])


def test_every_endpoint_and_field_the_client_uses_is_in_the_schema(user):
    doc = schema(user)
    assert set(PATHS) <= set(doc["paths"]), set(PATHS) - set(doc["paths"])
    assert set(get_type_hints(Run)) <= component(doc, "Run"), set(get_type_hints(Run)) - component(doc, "Run")
    assert set(get_type_hints(Event)) <= component(doc, "RunEvent")


def test_the_schema_documents_the_idempotency_header_and_the_ticket(user):
    doc = schema(user)
    for path in ("/api/runs/", "/api/runs/{run_id}/cancel/", "/api/runs/{run_id}/resume/"):
        params = {(p["in"], p["name"]) for p in doc["paths"][path]["post"].get("parameters", [])}
        assert ("header", "Idempotency-Key") in params, path
    assert "200" in doc["paths"]["/api/runs/"]["post"]["responses"]  # the replay's answer
    ticket = doc["paths"]["/api/ws-ticket/"]["post"]["responses"]["201"]["content"]["application/json"]["schema"]
    ref = ticket["$ref"].rsplit("/", 1)[-1]
    assert component(doc, ref) == {"ticket", "expires_in"}
