"""Where the pieces run: in this process ('local') or as Ray actors (engines, rollout workers, trainer, channel).

`build_runtime` starts them and hands the driver the same `Runtime` (trainer/runtime.py) either way: engine
handles behind a PublicationController, workers behind a RolloutScheduler, a trainer it calls synchronously, and
the Channel the workers put groups into and the trainer takes batches from (trainer/data_path.py). On Ray
every actor runs in its own bundle of the run's placement group (trainer/placement.py), with exactly that
bundle's resources and as many torch/OpenMP threads as the bundle has whole CPUs.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollout.channel import Channel
from rollout.publication import PublicationController
from rollout.scheduler import RolloutScheduler
from trainer.config import TrainConfig
from trainer.data_path import GroupTokens
from trainer.engine import Engine
from trainer.learner_actor import LearnerActor
from trainer.placement import Emit, Placement, driver_bundle, local_placement, pin_threads, reserve
from trainer.runtime import LoopThread, Runtime
from trainer.sampler import GroupSampler
from trainer.serving import Serving, serving_data, serving_key, start_local, start_ray
from trainer.worker import RolloutWorker

REPO_ROOT = Path(__file__).resolve().parent.parent


class _LoopWorker:
    """Adapts an async RolloutWorker to the scheduler's local protocol (returns a concurrent Future)."""

    def __init__(self, worker: RolloutWorker, loop: LoopThread) -> None:
        self.worker, self._loop = worker, loop

    def generate_group(self, group: Any, batch_id: Any) -> cf.Future[Any]:
        return self._loop.submit(self.worker.generate_group(group, batch_id))


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
