"""What a training run reports: the `data` of its rollout, train and gate events, built from plain values.

Pure functions, no I/O: `trainer.loop` gathers the numbers and emits the events; the keys each type must carry
are `trainer.events`' schema.
"""

from __future__ import annotations

from typing import Any

from rollout.types import RolloutBatch
from trainer.episodes import Group

# The gate event keeps only these keys of each engine's snapshot (the optional ones when the engine has them:
# the batching engine's in-flight requests, batch bound, session bound, evictions and safe rejections).
_GATE_ENGINE_KEYS = ("engine", "state", "version", "active", "waiting", "sessions")
_GATE_ENGINE_OPTIONAL = ("inflight", "max_batch", "max_sessions", "evictions", "rejections", "poison_reason")


def batch_filtered_rate(batch: RolloutBatch) -> float:
    """Share of the groups generated for `batch` that a filter dropped."""
    n_dropped = sum(batch.dropped.values())
    return n_dropped / max(1, n_dropped + len(batch.groups))


def rollout_data(
    step: int,
    version: int,
    groups: list[Group],
    batch: RolloutBatch,
    stale: int,
    seconds: float,
    aborted_by: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The rollout event of the batch for `step`: `groups` are the kept ones, generated at `version` or later.
    `aborted_by`: the workers' aborted episodes since the run started, per reason (when any was aborted)."""
    rewards = [r for g in groups for r in g.rewards]
    extra = {"aborted_by": aborted_by} if aborted_by else {}
    return {
        **extra,
        "step": step,
        "groups": len(groups),
        "samples": len(rewards),
        "group_ids": [g.group_id for g in groups],
        "epochs": [g.epoch for g in groups],
        "dropped": batch.dropped,
        "filtered_rate": batch_filtered_rate(batch),
        "aborted": batch.aborted,
        "stale": stale,
        "seconds": seconds,
        "reward_mean": sum(rewards) / max(1, len(rewards)),
        "min_token_version": min((g.min_version for g in groups), default=version),
        "engines": sorted({e for g in groups for e in g.engines}),
    }


def train_data(
    version: int,
    stats: dict[str, Any],
    groups: list[Group],
    *,
    filtered_rate: float,
    elapsed: float,
    samples: int,
    gate_closed_s: float,
) -> dict[str, Any]:
    """The train event of the step that produced `version` (the learner's `stats`), before any evaluation."""
    return {
        "step": version,
        "loss": stats["loss"],
        "reward_mean": stats["reward_mean"],
        "exact_match": stats["exact_match"],
        "kl": stats["kl"],
        "entropy": stats["entropy"],
        "staleness_max": max((version - 1 - g.min_version for g in groups), default=0),
        "pg_loss": stats["pg_loss"],
        "clip_frac": stats["clip_frac"],
        "grad_norm": stats["grad_norm"],
        "filtered_rate": filtered_rate,
        "groups": len(groups),
        "group_ids": [g.group_id for g in groups],
        "epochs": [g.epoch for g in groups],
        "train_seconds": stats["train_seconds"],
        "elapsed_s": elapsed,
        "samples_per_s": samples / max(elapsed, 1e-9),
        "gate_closed_share": gate_closed_s / max(elapsed, 1e-9),
    }


def gate_data(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The gate event from a publication snapshot: each engine trimmed to the keys the dashboard draws."""
    engines = [
        {**{k: e.get(k) for k in _GATE_ENGINE_KEYS}, **{k: e[k] for k in _GATE_ENGINE_OPTIONAL if k in e}}
        for e in snapshot["engines"]
    ]
    return {**snapshot, "engines": engines}
