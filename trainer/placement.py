"""The run's gang reservation on Ray: one placement group holding every actor's bundle (trainer/resources.py),
reserved all at once before any actor starts, and the options that schedule each actor into its own bundle.

`reserve` posts the `resources` events of docs/execution.md: `waiting` before it waits for the group, then
`timeout` (the group is removed and `PlacementTimeout` raised: the job exits 0 and the platform requeues the run)
or `placed` as soon as the group is ready, with the node of the driver and of every bundle
(`Placement.placed_data`); once the caller has started its actors in it, it posts `ready` with the same nodes
(`Placement.ready_data`). 'local' mode reserves no group: `local_placement` is just the driver's node.
Ray is imported inside the functions, so importing this module does not load it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer.config import TrainConfig
from trainer.resources import Bundle, actor_bundles, bundle_index, run_bundles
from trainer.stopping import StopRequested

Emit = Callable[[str, dict[str, Any]], Any]
# How often a wait for the group looks at the run's stop request.
STOP_POLL_S = 1.0


class PlacementTimeout(Exception):
    """The group was not ready within `placement_timeout_s`; it is removed and `timeout` was posted."""


@dataclass
class Placement:
    """Where the run's processes are: the group (None in 'local' mode), the node of the driver and of every
    bundle in order (`nodes[0]` is the driver's), and how long the job waited for the group."""

    cfg: TrainConfig
    group: Any = None  # ray.util.placement_group.PlacementGroup
    nodes: list[str] = field(default_factory=list)
    waited_s: float = 0.0

    def bundle(self, role: str) -> Bundle:
        """The bundle of an actor role ('learner', 'channel', 'engine-0', 'worker-1', ...)."""
        return actor_bundles(self.cfg)[bundle_index(self.cfg, role)]

    def actor_options(self, role: str) -> dict[str, Any]:
        """Ray actor options for `role`: exactly its bundle's resources, scheduled into that bundle of the group."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.bundle(role)
        return {
            "num_cpus": bundle.cpus,
            "num_gpus": bundle.gpus,
            "memory": bundle.memory,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group, placement_group_bundle_index=bundle_index(self.cfg, role)
            ),
        }

    def placed_data(self) -> dict[str, Any]:
        """The `resources` event posted as soon as the group is ready, before any actor starts: a run's processes
        then take seconds to start (a Ray worker process each, its imports), and the run is not waiting for
        resources any more meanwhile."""
        starting = len(self.nodes) - 1
        return {
            "state": "placed",
            "strategy": self.cfg.placement_strategy,
            "waited_s": round(self.waited_s, 3),
            "nodes": list(self.nodes),
            "detail": f"placement group ready after {self.waited_s:.1f} s; starting {starting} process(es)",
        }

    def ready_data(self) -> dict[str, Any]:
        """The `resources` event posted once every actor is started in the group."""
        return {
            "state": "ready",
            "strategy": self.cfg.placement_strategy,
            "waited_s": round(self.waited_s, 3),
            "nodes": list(self.nodes),
            "detail": f"{len(self.nodes)} process(es) placed"
            if self.group is not None
            else "no placement group ('local' mode: one process, the driver)",
        }

    def remove(self) -> None:
        """Give the group's resources back to Ray (idempotent; a no-op in 'local' mode)."""
        group, self.group = self.group, None
        if group is None:
            return
        try:
            from ray.util import remove_placement_group

            remove_placement_group(group)
        except Exception:  # noqa: BLE001 - Ray gone: the group died with it (it fate-shares with this driver)
            pass


def driver_bundle(cfg: TrainConfig) -> Bundle:
    return run_bundles(cfg)[0]


def pin_threads(threads: int) -> None:
    """This process computes with `threads` threads (its bundle's whole CPUs, at least one)."""
    import torch

    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def _describe(bundles: list[Bundle], strategy: str) -> str:
    cpus = round(sum(b.cpus for b in bundles), 4)
    gpus = round(sum(b.gpus for b in bundles), 4)
    mib = sum(b.memory for b in bundles) // (1024 * 1024)
    return f"{len(bundles)} bundles ({strategy}): CPU {cpus}, GPU {gpus}, memory {mib} MiB"


def reserve(cfg: TrainConfig, emit: Emit, stop: Callable[[], bool] = lambda: False) -> Placement:
    """Create the run's placement group and wait for it (posting `waiting`, then `placed` once it is ready, or
    `timeout` when it does not come).
    The caller schedules its actors with `Placement.actor_options`, posts `ready_data()` and removes the group
    when the run ends (Runtime.close); on any error here the group is removed before the error propagates, and
    a stop request (`stop()` true) ends the wait with StopRequested."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table

    if not ray.is_initialized():
        # Inside a Ray job this attaches to the job's cluster (RAY_ADDRESS too); standalone it starts one.
        # No job-level runtime_env here: it would fight the one a job was submitted with. Actors get theirs.
        ray.init()
    bundles = actor_bundles(cfg)
    strategy = cfg.placement_strategy
    placement = Placement(cfg)
    placement.group = placement_group([b.to_ray() for b in bundles], strategy=strategy)
    t0 = time.monotonic()
    try:
        emit(
            "resources",
            {"state": "waiting", "strategy": strategy, "waited_s": 0.0, "detail": _describe(bundles, strategy)},
        )
        ref = placement.group.ready()
        ready: list[Any] = []
        deadline = t0 + cfg.placement_timeout_s
        while not ready and time.monotonic() < deadline:
            ready, _ = ray.wait([ref], timeout=max(0.0, min(STOP_POLL_S, deadline - time.monotonic())))
            if not ready and stop():
                raise StopRequested()
        placement.waited_s = time.monotonic() - t0
        if not ready:
            placement.remove()
            detail = f"placement group not ready within {cfg.placement_timeout_s:g} s: {_describe(bundles, strategy)}"
            emit(
                "resources",
                {"state": "timeout", "strategy": strategy, "waited_s": round(placement.waited_s, 3), "detail": detail},
            )
            raise PlacementTimeout(detail)
        ray.get(ready[0])  # surfaces a removed or failed group
        by_index = placement_group_table(placement.group)["bundles_to_node_id"]
        placement.nodes = [ray.get_runtime_context().get_node_id()] + [by_index[i] for i in range(len(bundles))]
        emit("resources", placement.placed_data())
        return placement
    except BaseException:
        placement.remove()
        raise


def local_placement(cfg: TrainConfig) -> Placement:
    """'local' mode: no group. The driver's node is known when the job runs on Ray (the platform always launches
    through the Ray job API, which sets RAY_ADDRESS); a run started by hand outside Ray reports no node."""
    nodes: list[str] = []
    try:
        import ray

        if not ray.is_initialized() and os.environ.get("RAY_ADDRESS"):
            ray.init()
        if ray.is_initialized():
            nodes = [ray.get_runtime_context().get_node_id()]
    except Exception:  # noqa: BLE001 - the node is information for the platform, not needed to train
        nodes = []
    return Placement(cfg, nodes=nodes)
