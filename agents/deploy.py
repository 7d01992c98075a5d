"""Deploying session server entrypoints as async Ray actors (the run's job starts them beside its engines)."""

from __future__ import annotations

from typing import Any

from agents.protocol import Limits
from agents.server import SessionServer


def deploy_server(
    engines: dict[str, Any],
    *,
    block_size: int,
    key: str,
    run: str = "run",
    limits: Limits | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    actor_options: dict[str, Any] | None = None,
) -> tuple[Any, str]:
    """Start one entrypoint as an async Ray actor in front of `engines` (actor handles); returns (handle, url)."""
    import ray

    options = {"max_concurrency": 1000, "num_cpus": 0.05, **(actor_options or {})}
    handle: Any = (
        ray.remote(SessionServer)
        .options(**options)
        .remote(engines, block_size=block_size, key=key, run=run, limits=limits)
    )
    return handle, ray.get(handle.start.remote(host, port), timeout=60)
