"""Helpers of the PostgreSQL fast-path tests (test_slots_pg_snapshot.py, test_slots_pg_lock.py): a loud failure
on another database, a submit, and the arguments of a grant to `starting`."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from runs.core import lifecycle
from runs.execution.submit import run_submit
from runs.models import RunStatus
from tests.runs.helpers import TEST_KIND


@pytest.fixture(autouse=True)
def _needs_postgresql() -> None:
    # The suite runs on PostgreSQL (`make test`); on another database this path is not used, so say so loudly.
    if connection.vendor != "postgresql":
        pytest.fail(
            "tests/runs/test_slots_pg_*.py test the PostgreSQL path: run them with a postgres DATABASE_URL",
            pytrace=False,
        )


def submit(owner, origin="api", name="r"):
    return run_submit(owner=owner, name=name, origin=origin, kind=TEST_KIND, config={"steps": 1})


def _starting_args() -> dict:
    now = timezone.now()
    return {
        "now": now,
        "allowed": lifecycle.allowed_from(RunStatus.STARTING),
        "columns": lifecycle.stamp("starting", now),
        "effects": lifecycle.granted_effects,
    }
