"""Where the pieces run: in this process ('local') or as Ray actors (engines, rollout workers, trainer, channel).

Either way the driver sees the same `Runtime`: engine handles behind a PublicationController, workers behind a
RolloutScheduler, a trainer it calls synchronously, and the Channel that carries batches to the trainer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import os
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.channel import Channel
from rollout.filters import MinValidAttemptsFilter, ZeroVarianceFilter
from rollout.invoke import is_ray_actor
from rollout.publication import PublicationController
from rollout.scheduler import RolloutScheduler
from trainer.config import TrainConfig
from trainer.engine import Engine
from trainer.learner_actor import LearnerActor
from trainer.sampler import GroupSampler
from trainer.worker import RolloutWorker

REPO_ROOT = Path(__file__).resolve().parent.parent


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


class _LoopWorker:
    """Adapts an async RolloutWorker to the scheduler's local protocol (returns a concurrent Future)."""

    def __init__(self, worker: RolloutWorker, loop: LoopThread) -> None:
        self.worker, self._loop = worker, loop

    def generate_group(self, group: Any, batch_id: Any) -> cf.Future[Any]:
        return self._loop.submit(self.worker.generate_group(group, batch_id))


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
    trainer_resources: dict[str, Any] = field(default_factory=dict)

    def trainer_call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        if self.uses_ray:
            import ray

            return ray.get(getattr(self.trainer, method).remote(*args), timeout=timeout)
        return getattr(self.trainer, method)(*args)

    def put_batch(self, groups: list[Any]) -> Any:
        """The object the channel carries for one batch: an object-store ref on Ray, the list itself locally."""
        if self.uses_ray:
            import ray

            return ray.put(groups)
        return groups

    def train_step(self, groups: list[Any]) -> dict[str, Any]:
        """Hand one batch to the trainer through the channel and train. The batch's references die with the
        step whether it succeeds or fails, so repeated failures do not grow the object store."""
        item = self.put_batch(groups)
        try:
            self.channel.put(item, weight=len(groups))
            stats: dict[str, Any] = self.trainer_call("train_from_channel", len(groups))
            return stats
        finally:
            # A failed step may leave the item in the channel: take it out so nothing keeps it alive.
            while not self.channel.empty():
                self.channel.get_nowait()
            del item

    def workers_call(self, method: str, *args: Any) -> list[Any]:
        if self.uses_ray:
            import ray

            return ray.get([getattr(w, method).remote(*args) for w in self.workers], timeout=30)
        return [getattr(w, method)(*args) for w in self.workers]

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
            if self.uses_ray:
                import ray

                for handle in [*self.engines.values(), *self.workers, self.trainer]:
                    try:
                        ray.kill(handle)
                    except Exception:  # noqa: BLE001
                        pass
            self.loop.close()


def build_filters(cfg: TrainConfig) -> list[Any]:
    filters: list[Any] = []
    if cfg.filter_zero_variance:
        filters.append(ZeroVarianceFilter())
    if cfg.min_valid_attempts >= 1:
        filters.append(MinValidAttemptsFilter(cfg.min_valid_attempts))
    return filters


def build_runtime(cfg: TrainConfig, sampler: GroupSampler, *, engines_open: bool = True) -> Runtime:
    """Start engines, workers, trainer and channel; engines start closed when weights will be restored."""
    loop = LoopThread()
    name = f"trainer-{uuid.uuid4().hex[:8]}"
    engine_ids = [f"engine-{i}" for i in range(cfg.num_engines)]
    if cfg.mode == "local":
        engines = {e: Engine(cfg, e, initially_open=engines_open) for e in engine_ids}
        # Gates are asyncio objects: build them on the loop that will drive them.
        workers = [RolloutWorker(cfg, f"worker-{i}", engines) for i in range(cfg.num_workers)]
        channel = Channel.create(name, local=True)
        trainer: Any = LearnerActor(cfg, name)
        invokables: list[Any] = [_LoopWorker(w, loop) for w in workers]
        resources: dict[str, Any] = {"device": trainer.info()["device"]}
        uses_ray = False
    else:
        engines, workers, trainer, channel, resources = _start_ray_actors(cfg, name, engine_ids, engines_open)
        invokables = workers
        uses_ray = True
    scheduler = RolloutScheduler(
        invokables,
        [cfg.worker_capacity] * cfg.num_workers,
        sampler,
        cfg.prompts_per_step,
        filters=build_filters(cfg),
        poll_interval_s=0.005,
    )
    return Runtime(
        cfg=cfg,
        loop=loop,
        engines=engines,
        workers=workers,
        trainer=trainer,
        channel=channel,
        publication=PublicationController(engines),
        scheduler=scheduler,
        sampler=sampler,
        uses_ray=uses_ray,
        trainer_resources=resources,
    )


def _start_ray_actors(
    cfg: TrainConfig, name: str, engine_ids: list[str], engines_open: bool
) -> tuple[dict[str, Any], list[Any], Any, Channel, dict[str, Any]]:
    """Engines, workers, trainer (Ray actor handles, typed Any: Ray types a handle's methods as the plain
    class's, without `.remote`), the channel, and the trainer's resources."""
    import ray

    if not ray.is_initialized():
        # Inside a Ray job this attaches to the job's cluster (RAY_ADDRESS too); standalone it starts one.
        # No job-level runtime_env here: it would fight the one a job was submitted with. Actors get theirs.
        ray.init()
    env = {"env_vars": actor_env()}
    # Logical CPUs are not reserved (num_cpus=0): on a 2-core machine the actors share cores anyway, and
    # reserving them would deadlock placement on small clusters. Threads are pinned to 1 per actor instead.
    engine_cls = ray.remote(Engine)
    engines: dict[str, Any] = {
        e: engine_cls.options(num_cpus=0, max_concurrency=1000, runtime_env=env, name=f"{name}-{e}").remote(
            cfg, e, initially_open=engines_open
        )
        for e in engine_ids
    }
    worker_cls = ray.remote(RolloutWorker)
    workers: list[Any] = [
        worker_cls.options(num_cpus=0, max_concurrency=cfg.worker_capacity + 16, runtime_env=env).remote(
            cfg, f"worker-{i}", engines
        )
        for i in range(cfg.num_workers)
    ]
    channel = Channel.create(name, actor_options={"runtime_env": env})
    gpus = ray.cluster_resources().get("GPU", 0)  # type: ignore[no-untyped-call]  # ray leaves it unannotated
    num_gpus = 1 if cfg.device != "cpu" and gpus >= 1 else 0
    trainer: Any = ray.remote(LearnerActor).options(num_cpus=0, num_gpus=num_gpus, runtime_env=env).remote(cfg, name)
    info = ray.get(trainer.info.remote())
    ray.get([h.ping.remote() for h in engines.values()] + [w.stats.remote() for w in workers])
    return engines, workers, trainer, channel, {"device": info["device"], "num_gpus": num_gpus, "cluster_gpus": gpus}


def actor_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")] if p)
    return {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": path}
