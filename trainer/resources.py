"""What a run asks the cluster for: one bundle per process, derived from its config. Pure (no Ray, no Django).

The platform admits a run only when all of its bundles fit the cluster's free resources at once
(runs/slots/resources.py), and the job asks Ray for exactly these: the driver's bundle as the Ray job's
entrypoint resources, the others as one placement group (`actor_bundles`) that every actor is scheduled into
(trainer/placement.py). Bundle order is fixed: driver, then learner, channel, engines, workers, servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.config import TrainConfig

MIB = 1024 * 1024
# The channel actor only relays references between processes; it gets a small fixed share.
CHANNEL_CPUS = 0.05
# An evaluation job loads a checkpoint and runs greedy decoding in its one process.
EVAL_CPUS = 0.5
# A session server relays HTTP requests to engines and keeps token records: a small share of memory is enough.
SERVER_MEMORY_MB = 256
EVAL_MEMORY_MB = 512


@dataclass(frozen=True)
class Bundle:
    """One process's reservation: `role` names the process ('driver', 'learner', 'channel', 'engine-0', ...)."""

    role: str
    cpus: float
    gpus: float = 0.0
    memory: int = 0  # bytes

    def to_ray(self) -> dict[str, float]:
        """The bundle as Ray resources (a zero GPU is left out: Ray refuses zero-valued bundle entries)."""
        out = {"CPU": self.cpus, "memory": float(self.memory)}
        if self.gpus:
            out["GPU"] = self.gpus
        return out

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "CPU": self.cpus, "GPU": self.gpus, "memory": self.memory}

    @property
    def threads(self) -> int:
        """torch threads for the process: one per whole reserved CPU, at least one."""
        return threads_for(self.cpus)


def threads_for(cpus: float) -> int:
    return max(1, int(cpus))


def run_bundles(cfg: TrainConfig) -> list[Bundle]:
    """Every process of an rl_train run with what it reserves: the driver first, then the actors in the order
    of their placement-group bundles. 'local' mode is one process: the driver also reserves the learner's share."""
    memory = cfg.actor_memory_mb * MIB
    if cfg.mode == "local":
        return [Bundle("driver", round(cfg.driver_cpus + cfg.learner_cpus, 4), cfg.learner_gpus, memory)]
    bundles = [
        Bundle("driver", cfg.driver_cpus, 0.0, memory),
        Bundle("learner", cfg.learner_cpus, cfg.learner_gpus, memory),
        Bundle("channel", CHANNEL_CPUS, 0.0, memory),
    ]
    bundles += [Bundle(f"engine-{i}", cfg.engine_cpus, cfg.engine_gpus, memory) for i in range(cfg.num_engines)]
    bundles += [Bundle(f"worker-{i}", cfg.worker_cpus, 0.0, memory) for i in range(cfg.num_workers)]
    server_memory = min(memory, SERVER_MEMORY_MB * MIB)
    bundles += [Bundle(f"server-{i}", cfg.server_cpus, 0.0, server_memory) for i in range(servers_of(cfg))]
    return bundles


def servers_of(cfg: TrainConfig) -> int:
    """Session servers a run starts: `num_servers` when it names an environment (agents over HTTP), else none."""
    return cfg.num_servers if cfg.environment else 0


def actor_bundles(cfg: TrainConfig) -> list[Bundle]:
    """The placement group's bundles (everything but the driver); index i of this list is bundle i."""
    return run_bundles(cfg)[1:]


def bundle_index(cfg: TrainConfig, role: str) -> int:
    """The placement-group bundle index of an actor role ('learner', 'channel', 'engine-1', 'worker-0', ...)."""
    for i, bundle in enumerate(actor_bundles(cfg)):
        if bundle.role == role:
            return i
    raise KeyError(f"no bundle for role {role!r}")


def eval_bundles() -> list[Bundle]:
    """An evaluation job: its driver process only."""
    return [Bundle("driver", EVAL_CPUS, 0.0, EVAL_MEMORY_MB * MIB)]


def demand_json(bundles: list[Bundle], strategy: str) -> dict[str, Any]:
    """The `resources` object of a run (Run JSON, stored on the run at submit): bundles, their total, strategy."""
    return {
        "bundles": [b.to_json() for b in bundles],
        "total": {
            "CPU": round(sum(b.cpus for b in bundles), 4),
            "GPU": round(sum(b.gpus for b in bundles), 4),
            "memory": sum(b.memory for b in bundles),
        },
        "strategy": strategy,
    }
