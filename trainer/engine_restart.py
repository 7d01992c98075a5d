"""Engine recovery: replace a dead engine with a new one at the run's current weight version.

The driver calls `restart_engine(rt, engine_id, version)` between publications (never while one is prepared).
The new engine starts with its gate closed in the dead engine's bundle, is brought to `version` with the
trainer's weights (drain -> install -> reopen, the publication protocol on one engine), and only then joins
the PublicationController and every worker's router. Sessions of the dead engine stay tombstoned: their
episodes are aborted and run again, never continued without their cache.
"""

from __future__ import annotations

from typing import Any

from rollout.invoke import call
from trainer.engine import Engine
from trainer.placement import driver_bundle
from trainer.runtime import Runtime
from trainer.topology import engine_actor


def restart_engine(rt: Runtime, engine_id: str, version: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """Start `engine_id` again (killing the old actor if it still lives); returns the new engine's snapshot."""
    if rt.publication.prepared:
        raise RuntimeError("restart_engine: a publication is in progress; restart between publications")
    if engine_id not in [f"engine-{i}" for i in range(rt.cfg.num_engines)]:
        raise ValueError(f"unknown engine {engine_id!r}")
    old = rt.engines.pop(engine_id, None)
    rt.publication.remove_engine(engine_id)
    rt.workers_call("engine_lost", engine_id, "engine restarted")
    rt.servers_call("engine_lost", engine_id, "engine restarted")
    rt.restarts += 1
    if rt.uses_ray:
        import ray

        if old is not None:
            try:
                ray.kill(old)  # a live but unwanted engine frees its bundle first
            except Exception:  # noqa: BLE001 - already dead
                pass
        handle = engine_actor(rt.cfg, rt.name, engine_id, rt.placement, initially_open=False, generation=rt.restarts)
        weights: Any = rt.trainer.weights.remote() if version > 0 else None
    else:
        driver = driver_bundle(rt.cfg)
        handle = Engine(rt.cfg, engine_id, initially_open=False, threads=driver.threads, gpus=driver.gpus)
        weights = rt.trainer.weights() if version > 0 else None
    snap: dict[str, Any] = rt.loop.run(_restore(handle, version, weights, timeout_s), timeout_s + 5)
    rt.engines[engine_id] = handle
    rt.publication.add_engine(engine_id, handle)
    rt.workers_call("engine_added", engine_id, handle)
    rt.servers_call("engine_added", engine_id, handle)
    return snap


async def _restore(handle: Any, version: int, weights: Any, timeout_s: float) -> dict[str, Any]:
    """Bring a new, closed engine to `version` and open it (version 0: its seeded weights already are v0's)."""
    await call(handle, "drain", timeout_s)  # nothing in flight yet: marks the closed gate drained
    if version > 0:
        await call(handle, "install_version", version, weights=weights)
    await call(handle, "reopen")
    snap: dict[str, Any] = await call(handle, "snapshot")
    return snap
