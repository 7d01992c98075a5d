"""How big an engine's running batch and KV memory are, from its device (pure: tested without a GPU).

CPU (the default, and what tests use): a quarter of the actor's reserved memory holds KV rows, and a step
batches at most 64 requests (2 cores saturate long before that). GPU: half of the engine's share of the
device's memory holds KV rows, and a step batches up to 256 requests. Sessions are bounded by both the rows
that fit (`rows // group_size`) and `MAX_SESSIONS`. `sizing_on_device` reads a real device's memory for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer.kvpool import kv_bytes_per_row

if TYPE_CHECKING:
    import torch

    from trainer.config import TrainConfig

MiB = 1024 * 1024
MAX_SESSIONS = 4096
CPU_KV_SHARE = 0.25  # of actor_memory_mb
GPU_KV_SHARE = 0.5  # of the engine's share of device memory
CPU_MAX_BATCH = 64
GPU_MAX_BATCH = 256


@dataclass(frozen=True)
class EngineSizing:
    device: str  # "cpu" | "cuda"
    max_batch: int  # requests advanced together by one forward step
    max_sessions: int  # sessions whose KV caches fit at once (past it the least recently used idle one is evicted)
    kv_rows: int  # sequence rows in the KV pool (max_sessions * group_size)
    kv_bytes: int  # what the pool holds when full


def engine_sizing(
    *,
    device: str,
    n_layer: int,
    d_model: int,
    block_size: int,
    group_size: int,
    actor_memory_mb: int,
    device_memory_bytes: int = 0,
    gpu_share: float = 0.0,
) -> EngineSizing:
    """Size one engine: `device_memory_bytes` is the GPU's total memory and `gpu_share` the engine's share of
    it (its `engine_gpus`, at most 1); both are ignored on the CPU."""
    per_row = kv_bytes_per_row(n_layer, d_model, block_size)
    if device == "cuda":
        if device_memory_bytes <= 0 or gpu_share <= 0:
            raise ValueError("a CUDA engine needs its device memory and a positive GPU share")
        budget = int(device_memory_bytes * min(gpu_share, 1.0) * GPU_KV_SHARE)
        max_batch = GPU_MAX_BATCH
    else:
        budget = int(actor_memory_mb * MiB * CPU_KV_SHARE)
        max_batch = CPU_MAX_BATCH
    sessions = max(1, min(MAX_SESSIONS, budget // (per_row * group_size)))
    rows = sessions * group_size
    return EngineSizing(device, max_batch, sessions, rows, rows * per_row)


def sizing_on_device(cfg: TrainConfig, block_size: int, device: torch.device, gpus: float) -> EngineSizing:
    """`engine_sizing` for an engine of `cfg` on `device`, with its bundle's `gpus` (a CUDA device's memory is
    read from it)."""
    import torch

    memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
    return engine_sizing(
        device=device.type,
        n_layer=cfg.n_layer,
        d_model=cfg.d_model,
        block_size=block_size,
        group_size=cfg.group_size,
        actor_memory_mb=cfg.actor_memory_mb,
        device_memory_bytes=memory,
        gpu_share=gpus if gpus > 0 else 1.0,  # device 'cuda' asked for without a bundle GPU: the whole device
    )
