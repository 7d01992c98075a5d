"""The run's session servers (agents/server.py): started beside the engines, one per `num_servers`, each in its
own placement bundle (trainer/resources.py, `server-i`; only in a run that names an `environment`), told about
engines that die or restart, and announced with a `serving` event ({url, model}) so the platform can proxy to the
first one (docs/api.md).

The bearer key: the platform's per-run serving key (trainer/serving_key.py); a run started by hand without one
gets a random key it keeps to itself (its own workers still reach the server; nobody outside can)."""

from __future__ import annotations

import os
import secrets
from typing import Any

from agents.server import SessionServer
from trainer.agent_episodes import Serving
from trainer.config import TrainConfig
from trainer.problems import policy_shape
from trainer.resources import servers_of
from trainer.serving_key import serving_key_from_env

__all__ = ["Serving", "run_label", "serving_data", "serving_key", "start_local", "start_ray"]


def run_label() -> str:
    """The model name's run part: the platform's run id, or 'trainer' for a run started by hand."""
    return f"run-{os.environ['RUN_ID']}" if os.environ.get("RUN_ID") else "trainer"


def serving_key() -> str:
    return serving_key_from_env() or secrets.token_urlsafe(32)


def start_local(cfg: TrainConfig, engines: dict[str, Any], loop: Any, key: str) -> tuple[list[Any], list[str]]:
    """In this process, on the run's loop thread (local mode: everything is one process), on loopback."""
    servers, urls = [], []
    for _ in range(servers_of(cfg)):
        server = SessionServer(engines, block_size=policy_shape(cfg)[1], key=key, run=run_label())
        urls.append(loop.run(server.start("127.0.0.1"), timeout=30))
        servers.append(server)
    return servers, urls


def start_ray(
    cfg: TrainConfig, name: str, engines: dict[str, Any], options: Any, key: str
) -> tuple[list[Any], list[str]]:
    """One async actor per entrypoint in its bundle (`options(role)`: the bundle's resources and scheduling),
    bound to its node's cluster address so the platform's proxy can reach it."""
    import ray

    remote = ray.remote(SessionServer)
    servers: list[Any] = [
        remote.options(**options(f"server-{i}"), max_concurrency=1000, name=f"{name}-server-{i}").remote(
            engines, block_size=policy_shape(cfg)[1], key=key, run=run_label()
        )
        for i in range(servers_of(cfg))
    ]
    urls: list[str] = ray.get([s.start.remote(None) for s in servers], timeout=120)
    return servers, urls


def serving_data(urls: list[str]) -> dict[str, Any]:
    """The `serving` event's data: the first entrypoint (the one the platform proxies to) and the model."""
    return {"url": urls[0], "model": f"{run_label()}@v0"}
