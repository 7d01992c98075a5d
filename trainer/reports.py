"""What a training run reports: the `data` of its rollout, train, gate and agents events, built from plain values.

Pure functions, no I/O: `trainer.loop` gathers the numbers and emits the events; the keys each type must carry
are `trainer.events`' schema.
"""

from __future__ import annotations

import math
from typing import Any

from rollout.types import RolloutBatch
from trainer.episodes import Group
from trainer.event_fields import MAP_MAX, NAME_MAX
from trainer.events import RolloutSpans, Span
from trainer.histograms import step_histograms
from trainer.step_schema import AGENT_STATUSES

# Keys of the train event that are not run metrics (RunResult.metrics): lists, spans and histograms.
NOT_METRICS = frozenset({"group_ids", "epochs", "histograms", "span", "eval_span"})

# The gate event keeps only these keys of each engine's snapshot (the optional ones when the engine has them:
# the batching engine's in-flight requests, batch bound, session bound, evictions, safe rejections, sessions
# gone, forward steps and the rows they advanced, and a poisoned gate's reason).
_GATE_ENGINE_KEYS = ("engine", "state", "version", "active", "waiting", "sessions")
_GATE_ENGINE_OPTIONAL = (
    "inflight",
    "max_batch",
    "max_sessions",
    "evictions",
    "rejections",
    "sessions_gone",
    "steps",
    "rows_stepped",
    "poison_reason",
)


# The rollout workers' counters it sums (trainer/agent_episodes.py `AgentRunner.counts`).
AGENT_WORKER_COUNTS = ("episodes", "tool_calls", "valid_tool_calls", "tool_errors")


def batch_filtered_rate(batch: RolloutBatch) -> float:
    """Share of the groups generated for `batch` that a filter dropped."""
    n_dropped = sum(batch.dropped.values())
    return n_dropped / max(1, n_dropped + len(batch.groups))


def span(start: float, end: float) -> Span:
    return Span(start=start, end=max(start, end))


def rollout_spans(batch: RolloutBatch) -> RolloutSpans:
    """Per worker and per engine: the first start and last end of the batch's groups (workers stamp them)."""
    workers: dict[str, list[float]] = {}
    engines: dict[str, list[float]] = {}
    for result in batch.groups:
        meta = result.meta or {}
        start, end = meta.get("started_at"), meta.get("ended_at")
        if not isinstance(start, float) or not isinstance(end, float):
            continue
        names = [(workers, str(meta.get("worker", "worker")))]
        served = meta.get("engines") or getattr(result.payload, "engines", [])  # a receipt names them in meta
        names += [(engines, str(e)) for e in sorted(set(served))]
        for table, name in names:
            lo_hi = table.setdefault(name, [start, end])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], start), max(lo_hi[1], end)
    return RolloutSpans(
        workers={k: span(*v) for k, v in sorted(workers.items())},
        engines={k: span(*v) for k, v in sorted(engines.items())},
    )


def rollout_data(
    step: int,
    version: int,
    groups: list[Group],
    batch: RolloutBatch,
    stale: int,
    seconds: float,
    aborted_by: dict[str, int] | None = None,
    *,
    started_at: float | None = None,
) -> dict[str, Any]:
    """The rollout event of the batch for `step`: `groups` are the kept ones, generated at `version` or later.
    `aborted_by`: the workers' aborted episodes since the run started, per reason (when any was aborted); with
    `started_at` (wall clock), its `span` and the per-worker and per-engine `spans` (trace export)."""
    rewards = [r for g in groups for r in g.rewards]
    extra: dict[str, Any] = {"aborted_by": aborted_by} if aborted_by else {}
    if started_at is not None:
        extra.update(span=span(started_at, started_at + seconds), spans=rollout_spans(batch))
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
    edges: dict[str, list[float]] | None = None,
    steps_total: int,
) -> dict[str, Any]:
    """The train event of the step that produced `version` (the learner's `stats`), before any evaluation;
    with the run's bucket `edges` (trainer.histograms.run_edges) it carries the step's `histograms`."""
    return {
        "step": version,
        "steps_total": steps_total,
        **({"span": span(stats["started_at"], stats["ended_at"])} if "started_at" in stats else {}),
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
        # |engine - learner| log-prob over the tokens sampled with the trained weights (absent: none was).
        **{k: stats[k] for k in ("logprob_diff_mean", "logprob_diff_max") if k in stats},
        **({"histograms": step_histograms(groups, version=version, edges=edges)} if edges else {}),
    }


def gate_data(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The gate event from a publication snapshot: each engine trimmed to the keys the dashboard draws."""
    engines = [
        {**{k: e.get(k) for k in _GATE_ENGINE_KEYS}, **{k: e[k] for k in _GATE_ENGINE_OPTIONAL if k in e}}
        for e in snapshot["engines"]
    ]
    return {**snapshot, "engines": engines}


def agents_data(
    step: int, servers: list[dict[str, Any]], workers: list[dict[str, Any]], groups: list[Group]
) -> dict[str, Any]:
    """The agents event of `step`: each session server's `stats()` summed (sessions per engine summed by engine),
    the workers' `stats()["agents"]` counters summed, and the mean of each reward part over the episodes of the
    step's trained `groups` (`meta["reward_parts"]`: one {part: value} per episode; names cut to NAME_MAX
    characters, the first MAP_MAX names in order, finite values only)."""
    per_engine: dict[str, int] = {}
    status = dict.fromkeys(AGENT_STATUSES, 0)
    totals = {"sessions": 0, "waiting": 0, "requests": 0, "tokens": 0}
    for s in servers:
        for key in totals:
            totals[key] += int(s.get(key, 0))
        for engine, n in (s.get("sessions_per_engine") or {}).items():
            per_engine[str(engine)] = per_engine.get(str(engine), 0) + int(n)
        for code in AGENT_STATUSES:
            status[code] += int((s.get("status") or {}).get(code, 0))
    counts = dict.fromkeys(AGENT_WORKER_COUNTS, 0)
    for w in workers:
        for key in AGENT_WORKER_COUNTS:
            counts[key] += int((w.get("agents") or {}).get(key, 0))
    return {
        "step": step,
        **totals,
        "sessions_per_engine": dict(sorted(per_engine.items())),
        "status": status,
        **counts,
        "reward_parts": reward_parts_mean(groups),
    }


def reward_parts_mean(groups: list[Group]) -> dict[str, float]:
    """Mean of each reward part over the episodes that report it (see `agents_data`)."""
    sums: dict[str, list[float]] = {}
    for g in groups:
        for parts in (g.meta or {}).get("reward_parts") or []:
            for name, value in (parts or {}).items():
                key = str(name)[:NAME_MAX]
                if key not in sums and len(sums) >= MAP_MAX:
                    continue
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    total = sums.setdefault(key, [0.0, 0.0])
                    total[0] += float(value)
                    total[1] += 1
    return {k: total / n for k, (total, n) in sorted(sums.items())}
