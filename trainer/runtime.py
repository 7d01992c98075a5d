"""The driver's handle on a started run: `Runtime` (engine handles behind a PublicationController, workers behind
a RolloutScheduler, the trainer it calls synchronously, the Channel, the session servers) and the `LoopThread` its
publication calls and local engines/workers run on. Either mode, local objects or Ray actor handles, looks the
same through it; `trainer.topology.build_runtime` builds one, `Runtime.close` tears it down.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
from dataclasses import dataclass, field
from typing import Any

from rollout.channel import Channel
from rollout.invoke import is_ray_actor
from rollout.publication import PublicationController
from rollout.scheduler import RolloutScheduler
from trainer.config import TrainConfig
from trainer.data_path import batch_tokens
from trainer.placement import Placement
from trainer.sampler import GroupSampler
from trainer.serving import Serving


class LoopThread:
    """An asyncio loop on a daemon thread: the driver's publication calls and local engines/workers run on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="trainer-loop", daemon=True)
        self._thread.start()

    def submit(self, coro: Any) -> cf.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


@dataclass
class Runtime:
    cfg: TrainConfig
    loop: LoopThread
    engines: dict[str, Any]
    workers: list[Any]  # actor handles (ray) or RolloutWorker objects (local)
    trainer: Any
    channel: Channel
    publication: PublicationController
    scheduler: RolloutScheduler
    sampler: GroupSampler
    uses_ray: bool
    placement: Placement
    trainer_resources: dict[str, Any] = field(default_factory=dict)
    name: str = "trainer"  # prefix of the run's actor names
    restarts: int = 0  # engines restarted so far (trainer.engine_restart)
    servers: list[Any] = field(default_factory=list)  # session servers (trainer/serving.py): handles or objects
    serving_urls: list[str] = field(default_factory=list)
    serving: Serving | None = None  # how the driver reaches the first server (evaluation of an environment)

    def trainer_call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        if self.uses_ray:
            import ray

            return ray.get(getattr(self.trainer, method).remote(*args), timeout=timeout)
        return getattr(self.trainer, method)(*args)

    def take_batch(self, groups: int | None = None, more: bool = False) -> list[Any]:
        """The learner takes a token-weighted batch (of `groups` groups' tokens; default a step's) from the
        channel (trainer/data_path.py) and holds it, `more`: adding to what it holds; the groups come back for
        the ledger's claim and the reports."""
        taken: list[Any] = self.trainer_call("take_batch", batch_tokens(self.cfg, groups), 60.0, more)
        return taken

    def train_taken(self, groups: list[Any]) -> dict[str, Any]:
        """One training step on these of the learner's taken groups (the data never passes the driver again)."""
        stats: dict[str, Any] = self.trainer_call("train_taken", [(g.group_id, g.meta.get("attempt")) for g in groups])
        return stats

    def workers_call(self, method: str, *args: Any) -> list[Any]:
        if self.uses_ray:
            import ray

            return ray.get([getattr(w, method).remote(*args) for w in self.workers], timeout=30)
        return [getattr(w, method)(*args) for w in self.workers]

    def servers_call(self, method: str, *args: Any) -> list[Any]:
        """Call every session server (engine membership changes: `engine_lost`, `engine_added`)."""
        if self.uses_ray:
            import ray

            return ray.get([getattr(s, method).remote(*args) for s in self.servers], timeout=30)
        return [getattr(s, method)(*args) for s in self.servers]

    def engine_alive(self, engine_id: str, timeout_s: float = 10.0) -> bool:
        handle = self.engines[engine_id]
        if not is_ray_actor(handle):
            return True
        import ray

        try:
            ray.get(handle.ping.remote(), timeout=timeout_s)
            return True
        except Exception:  # noqa: BLE001 - any failure to answer means we stop routing to it
            return False

    def close(self) -> None:
        try:
            self.scheduler.close(timeout_s=10)
        finally:
            try:
                self.channel.close()
            except Exception:  # noqa: BLE001 - best effort teardown
                pass
            if not self.uses_ray:
                for worker in self.workers:
                    self.loop.run(worker.close(), timeout=10)  # an agent environment's HTTP client
                for server in self.servers:
                    self.loop.run(server.stop(), timeout=10)
            if self.uses_ray:
                import ray

                for handle in [*self.engines.values(), *self.workers, self.trainer, *self.servers]:
                    try:
                        ray.kill(handle)
                    except Exception:  # noqa: BLE001
                        pass
            self.placement.remove()
            self.loop.close()
