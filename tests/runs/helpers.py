"""Shared test helpers for runs/ and api/ tests: a tiny run kind, users, and Celery hand-off capture."""

from __future__ import annotations

from typing import Any

import pytest

from runs.errors import InvalidInput
from runs.execution.jobs import JobSpec
from runs.execution.kinds import KINDS, RunKind

TEST_KIND = "test_job"
# A test kind the launcher can submit (its job is never started: tests replace the Ray submit).
TEST_JOB_KIND = "test_ray_job"


def _validate(config: dict[str, Any]) -> dict[str, Any]:
    for key, value in config.items():
        if key != "steps":
            raise InvalidInput("unknown key", field=f"config.{key}")
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidInput("expected an integer", field="config.steps")
    return config


def _schema() -> dict[str, Any]:
    return {"type": "object", "properties": {"steps": {"type": "integer"}}, "additionalProperties": False}


def register_test_kind() -> None:
    """Add the test kinds to the static registry (tests only: production kinds are the KINDS literal)."""
    KINDS[TEST_KIND] = RunKind(name=TEST_KIND, validate_config=_validate, json_schema=_schema, description="test kind")
    KINDS[TEST_JOB_KIND] = RunKind(
        name=TEST_JOB_KIND,
        validate_config=_validate,
        json_schema=_schema,
        description="test kind with a job",
        job_spec=lambda run: JobSpec(["true"]),
    )


class Handoffs:
    """What was handed to Celery after commit (run ids), without a broker."""

    def __init__(self) -> None:
        self.dispatched: list[int] = []
        self.stopped: list[int] = []


@pytest.fixture
def handoffs(monkeypatch: pytest.MonkeyPatch) -> Handoffs:
    from runs import tasks

    got = Handoffs()
    monkeypatch.setattr(tasks.dispatch_run, "delay", lambda run_id: got.dispatched.append(run_id))
    monkeypatch.setattr(tasks.stop_run, "delay", lambda run_id, job="": got.stopped.append(run_id))
    return got


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("alice", password="pw-alice")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create_user("bob", password="pw-bob")


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("root", password="pw-root", is_staff=True)


@pytest.fixture(autouse=True)
def _fresh_policy_cache():
    """Each test starts without a cached policy from an earlier test's database."""
    from runs.slots import store

    store.policy_forget()
    yield
    store.policy_forget()


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # PBKDF2's deliberate slowness costs seconds per user on the shared 2-core machine.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
