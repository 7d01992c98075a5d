"""Where the pieces run: in this process ('local') or as Ray actors (engines, rollout workers, trainer, channel).

Either way the driver sees the same `Runtime`: engine handles behind a PublicationController, workers behind a
RolloutScheduler, a trainer it calls synchronously, and the Channel the workers put groups into and the trainer
takes batches from (trainer/data_path.py). On Ray
every actor runs in its own bundle of the run's placement group (trainer/placement.py), with exactly that
bundle's resources and as many torch/OpenMP threads as the bundle has whole CPUs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.channel import Channel
from rollout.invoke import is_ray_actor
from rollout.publication import PublicationController
from rollout.scheduler import RolloutScheduler
from trainer.config import TrainConfig
from trainer.data_path import GroupTokens, batch_tokens
from trainer.engine import Engine
from trainer.learner_actor import LearnerActor
from trainer.placement import Emit, Placement, driver_bundle, local_placement, pin_threads, reserve
from trainer.sampler import GroupSampler
from trainer.serving import Serving, serving_data, serving_key, start_local, start_ray
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


def build_runtime(
    cfg: TrainConfig,
    sampler: GroupSampler,
    *,
    engines_open: bool = True,
    emit: Emit | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> Runtime:
    """Reserve the run's resources, then start engines, workers, trainer and channel in them; engines start closed
    when weights will be restored. `emit` gets the `resources` events (waiting, then ready or timeout: then
    `PlacementTimeout` is raised with nothing left behind; `stop()` true while waiting: StopRequested); the
    group is removed on any error here."""
    emit = emit or (lambda type_, data: None)
    pin_threads(driver_bundle(cfg).threads)
    name = f"trainer-{uuid.uuid4().hex[:8]}"
    engine_ids = [f"engine-{i}" for i in range(cfg.num_engines)]
    placement = local_placement(cfg) if cfg.mode == "local" else reserve(cfg, emit, stop)
    try:
        loop = LoopThread()
        key = serving_key()
        if cfg.mode == "local":
            engines, workers, trainer, channel, resources, (servers, urls) = _start_local(
                cfg, name, engine_ids, engines_open, loop, key
            )
            invokables: list[Any] = [_LoopWorker(w, loop) for w in workers]
        else:
            engines, workers, trainer, channel, resources, (servers, urls) = _start_ray_actors(
                cfg, name, engine_ids, engines_open, placement, key
            )
            invokables = workers
        emit("resources", placement.ready_data())
        if urls:
            emit("serving", serving_data(urls))
        scheduler = RolloutScheduler(
            invokables,
            [cfg.worker_capacity] * cfg.num_workers,
            sampler,
            cfg.prompts_per_step,
            poll_interval_s=0.005,
            claims=True,  # workers filter, put kept groups into the channel and return receipts
        )
    except BaseException:
        placement.remove()  # kills whatever actors already started in it
        raise
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
        uses_ray=cfg.mode != "local",
        placement=placement,
        trainer_resources=resources,
        name=name,
        servers=servers,
        serving_urls=urls,
        serving=Serving(servers[0], urls[0], key) if servers else None,
    )


Servers = tuple[list[Any], list[str]]  # session servers (handles or objects) and their URLs


def _start_local(
    cfg: TrainConfig, name: str, engine_ids: list[str], engines_open: bool, loop: LoopThread, key: str
) -> tuple[dict[str, Any], list[Any], Any, Channel, dict[str, Any], Servers]:
    """Everything in this process, which reserved the driver bundle (the learner's share included)."""
    driver = driver_bundle(cfg)
    engines = {
        e: Engine(cfg, e, initially_open=engines_open, threads=driver.threads, gpus=driver.gpus) for e in engine_ids
    }
    servers, urls = start_local(cfg, engines, loop, key)
    serving = Serving(servers[0], urls[0], key) if servers else None
    # Gates are asyncio objects: build them on the loop that will drive them.
    channel = Channel.create(name, local=True, collector=GroupTokens)
    workers = [
        RolloutWorker(cfg, f"worker-{i}", engines, channel=name, serving=serving) for i in range(cfg.num_workers)
    ]
    trainer = LearnerActor(cfg, name, threads=driver.threads, gpus=driver.gpus)
    resources = {"device": trainer.info()["device"], "num_gpus": driver.gpus}
    return engines, workers, trainer, channel, resources, (servers, urls)


def _start_ray_actors(
    cfg: TrainConfig, name: str, engine_ids: list[str], engines_open: bool, placement: Placement, key: str
) -> tuple[dict[str, Any], list[Any], Any, Channel, dict[str, Any], Servers]:
    """Engines, workers, trainer (Ray actor handles, typed Any: Ray types a handle's methods as the plain
    class's, without `.remote`), the channel, and the trainer's resources; each actor in its bundle."""
    import ray

    def options(role: str) -> dict[str, Any]:
        return _actor_options(placement, role)

    engines: dict[str, Any] = {
        e: engine_actor(cfg, name, e, placement, initially_open=engines_open) for e in engine_ids
    }
    servers, urls = start_ray(cfg, name, engines, options, key)
    serving = Serving(servers[0], urls[0], key) if servers else None
    channel = Channel.create(name, collector=GroupTokens, actor_options=options("channel"))
    worker_cls = ray.remote(RolloutWorker)
    workers: list[Any] = [
        worker_cls.options(**options(f"worker-{i}"), max_concurrency=cfg.worker_capacity + 16).remote(
            cfg, f"worker-{i}", engines, channel=name, serving=serving
        )
        for i in range(cfg.num_workers)
    ]
    learner = placement.bundle("learner")
    trainer: Any = (
        ray.remote(LearnerActor)
        .options(**options("learner"))
        .remote(cfg, name, threads=learner.threads, gpus=learner.gpus)
    )
    info = ray.get(trainer.info.remote())
    ray.get([h.ping.remote() for h in engines.values()] + [w.stats.remote() for w in workers])
    return engines, workers, trainer, channel, {"device": info["device"], "num_gpus": learner.gpus}, (servers, urls)


def _actor_options(placement: Placement, role: str) -> dict[str, Any]:
    """A role's bundle resources and scheduling, and its env (threads from the bundle, the repo on the path)."""
    threads = placement.bundle(role).threads
    return {**placement.actor_options(role), "runtime_env": {"env_vars": actor_env(threads)}}


def engine_actor(
    cfg: TrainConfig, name: str, engine_id: str, placement: Placement, *, initially_open: bool, generation: int = 0
) -> Any:
    """One engine actor in its bundle (`generation` > 0: a restarted engine gets a fresh actor name)."""
    import ray

    bundle = placement.bundle(engine_id)
    options = {**placement.actor_options(engine_id), "runtime_env": {"env_vars": actor_env(bundle.threads)}}
    actor_name = f"{name}-{engine_id}" + (f"-r{generation}" if generation else "")
    return (
        ray.remote(Engine)
        .options(**options, max_concurrency=1000, name=actor_name)
        .remote(cfg, engine_id, initially_open=initially_open, threads=bundle.threads, gpus=bundle.gpus)
    )


def actor_env(threads: int = 1) -> dict[str, str]:
    """An actor's env vars: OpenMP/MKL threads from its bundle, and the repository on PYTHONPATH."""
    path = os.pathsep.join(p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")] if p)
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONPATH": path}
