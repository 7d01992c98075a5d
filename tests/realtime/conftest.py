"""Fixtures of the real-time tests: users with sessions, runs, an isolated channel-layer prefix, and helpers
that drive config.asgi.application through channels' WebsocketCommunicator."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from runs.models import Run, RunStatus


@pytest.fixture(autouse=True)
def isolated_layer(settings, redis_url: str):
    """A channel-layer prefix of our own: pub/sub channels are global in Redis, other test runs share it."""
    layers = {k: dict(v) for k, v in settings.CHANNEL_LAYERS.items()}
    layers["default"]["CONFIG"] = {**layers["default"]["CONFIG"], "prefix": f"t{uuid.uuid4().hex[:8]}"}
    settings.CHANNEL_LAYERS = layers
    settings.REALTIME_RESYNC_SECONDS = 0.5
    channel_layers.backends.clear()
    yield layers["default"]["CONFIG"]["prefix"]
    channel_layers.backends.clear()


def user_make(username: str, *, staff: bool = False) -> Any:
    """A user with a logged-in session (`user.cookie`), made in sync code so async tests can use it."""
    user = get_user_model().objects.create_user(username=username, password="pw", is_staff=staff)
    user.cookie = session_cookie(user)
    return user


def session_cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def run_make(owner: Any, *, status: str = RunStatus.RUNNING, name: str = "r") -> Run:
    return Run.objects.create(name=name, origin="api", run_class="app", kind="rl_train", owner=owner, status=status)


def communicator(path: str, user: Any | None) -> WebsocketCommunicator:
    from config.asgi import application

    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if user is not None:
        headers.append((b"cookie", f"sessionid={user.cookie}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


def gate(seq: int, version: int = 0) -> dict[str, Any]:
    return {
        "seq": seq,
        "type": "gate",
        "data": {"state": "open", "version": version, "active": 1, "waiting": 0, "engines": []},
    }


def train(seq: int, step: int) -> dict[str, Any]:
    return {
        "seq": seq,
        "type": "train",
        "data": {
            "step": step,
            "loss": 0.5,
            "reward_mean": 0.1 * step,
            "exact_match": 0.0,
            "kl": 0.0,
            "entropy": 1.0,
            "staleness_max": 0,
        },
    }


def run_async(fn, *args, **kwargs):
    return async_to_sync(fn)(*args, **kwargs)
