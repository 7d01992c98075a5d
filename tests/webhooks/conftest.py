"""Fixtures of the webhook tests: users, a receiver, private targets allowed (tests reach a receiver on this
machine; tests/webhooks/test_targets.py shows them refused when not), and the deliveries the drainer hands to
Celery, recorded instead of sent (the in-process tests then do each delivery's attempts themselves)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.runs.helpers import (  # noqa: F401
    _fast_password_hashing,
    handoffs,
    other_user,
    register_test_kind,
    staff,
    user,
)
from tests.webhooks.receiver import Receiver

register_test_kind()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def private_ok(settings):
    settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS = True
    settings.WEBHOOKS_RETRY_BASE_MS = 10
    settings.HEAVY_READ_THROTTLE_RATES = {"webhooks": "10000/min"}


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Delivery ids the drainer sent to Celery (recorded, not sent)."""
    from runs.webhooks import tasks

    got: list[str] = []
    monkeypatch.setattr(tasks.deliver, "delay", lambda delivery_id: got.append(delivery_id))
    return got


@pytest.fixture
def capture(django_capture_on_commit_callbacks):
    return django_capture_on_commit_callbacks
