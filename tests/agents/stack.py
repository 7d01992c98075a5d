"""A run's generation side on real Ray for the session server tests: engine actors (as trainer/topology.py
deploys them, minus the placement group) and a session server actor in front of them, tiny chat config."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from agents.deploy import deploy_server
from agents.protocol import Limits
from rollout.publication import PublicationController
from trainer.config import TrainConfig
from trainer.engine import Engine

CFG = TrainConfig(
    environment="chat", context_tokens=48, d_model=64, n_head=4, n_layer=1, group_size=2, device="cpu", seed=7
)
KEY = "test-key"


def engines(ray: Any, ids: list[str], cfg: TrainConfig = CFG) -> dict[str, Any]:
    handles = {
        e: ray.remote(Engine).options(num_cpus=0.1, max_concurrency=1000).remote(cfg, e, max_sessions=64) for e in ids
    }
    ray.get([h.ping.remote() for h in handles.values()], timeout=60)
    return handles


def server(engine_handles: dict[str, Any], cfg: TrainConfig = CFG, **limits: Any) -> tuple[Any, str]:
    return deploy_server(engine_handles, block_size=cfg.context_tokens, key=KEY, run="run-1", limits=Limits(**limits))


async def publish(handles: dict[str, Any], version: int, weights: dict | None = None) -> None:
    pc = PublicationController(handles)
    await pc.prepare(timeout_s=20)
    await pc.publish(version, **({"weights": weights} if weights is not None else {}))


def wait_for(pred: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


async def await_for(pred: Callable[[], Any], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)
