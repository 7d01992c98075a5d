"""Helpers of the run-config security tests (test_config_sandbox.py, test_config_bounds.py): the repository root,
a config submitted through the REST API, and the check that an answer is a 400 naming the field."""

from __future__ import annotations

from pathlib import Path

from rest_framework.test import APIClient

ROOT = Path(__file__).resolve().parents[2]


def submit(user, config: dict, kind: str = "rl_train"):
    client = APIClient()
    client.force_authenticate(user)
    return client.post("/api/runs/", {"name": "r", "origin": "api", "kind": kind, "config": config}, format="json")


def assert_refused(answer, field: str) -> None:
    assert answer.status_code == 400, answer.content
    body = answer.json()
    assert body["field"] == field, body
    assert field in body["detail"]
