"""The `data` of the events each training step reports (registered by type in trainer/event_schema.py): the
engines' `gate` state, a publication's `version`, the `sampler`'s progress, the `rollout` batch, the `train` step
and, for a run with an agent environment, the `agents` event. The `sample` event's data is trainer/sample_schema.py's;
the run's own events (status, worker, checkpoint, ...) are trainer/lifecycle_schema.py's.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field

from trainer.event_fields import (
    ENGINES_MAX,
    HISTOGRAM_BUCKETS_MAX,
    HISTOGRAMS_MAX,
    PHASES_MAX,
    Count,
    Counts,
    Ids,
    Int,
    Name,
    Names,
    Numbers,
    SpanModel,
    Spans,
    Text,
    _Data,
)


class GateEngine(_Data):
    engine: Name | None = None
    state: Name | None = None
    version: Int | None = None
    active: Int | None = None
    waiting: Int | None = None
    sessions: Int | None = None
    inflight: Int | None = None
    max_batch: Int | None = None
    max_sessions: Int | None = None
    evictions: Int | None = None
    rejections: Int | None = None
    sessions_gone: Int | None = None
    steps: Int | None = None  # forward steps since the engine started
    rows_stepped: Int | None = None  # rows those steps advanced: rows_stepped / steps is the batching
    poison_reason: Text | None = None


class GateData(_Data):
    state: Name
    version: Int | None
    active: Int
    waiting: Int
    engines: Annotated[list[GateEngine], Field(max_length=ENGINES_MAX)]


class VersionEngine(_Data):
    """One engine's share of a publication (rollout.publication.EngineCounts)."""

    engine: Name
    drained: Count
    admitted_at_reopen: Count


class VersionData(_Data):
    version: Int
    published_at: float
    pause_ms: float
    drain_ms: float | None = None
    phases: Annotated[dict[Name, SpanModel], Field(max_length=PHASES_MAX)] | None = None
    drained: Count | None = None  # leases in flight that the publication's drains waited for, all engines
    admitted_at_reopen: Count | None = None  # requests that waited at the closed gates, admitted at reopen
    engines: Annotated[list[VersionEngine], Field(max_length=ENGINES_MAX)] | None = None


class SamplerData(_Data):
    epoch: Int
    group_count: Int
    dataset_size: Int
    consumed_in_epoch: Int


class RolloutSpansModel(_Data):
    workers: Spans | None = None
    engines: Spans | None = None


class RolloutData(_Data):
    step: Int | None = None
    groups: Int | None = None
    samples: Int | None = None
    group_ids: Ids | None = None
    epochs: Ids | None = None
    dropped: Counts | None = None
    filtered_rate: float | None = None
    aborted: Int | None = None
    aborted_by: Counts | None = None
    stale: Int | None = None
    seconds: float | None = None
    reward_mean: float | None = None
    min_token_version: Int | None = None
    engines: Names | None = None
    span: SpanModel | None = None
    spans: RolloutSpansModel | None = None
    channel: Numbers | None = None


class HistogramModel(_Data):
    edges: Annotated[list[float], Field(max_length=HISTOGRAM_BUCKETS_MAX + 1)]
    counts: Annotated[list[Int], Field(max_length=HISTOGRAM_BUCKETS_MAX)]


class TrainData(_Data):
    step: Int
    loss: float
    reward_mean: float
    exact_match: float
    kl: float
    entropy: float
    staleness_max: Int
    steps_total: Int | None = None
    span: SpanModel | None = None
    eval_span: SpanModel | None = None
    pg_loss: float | None = None
    clip_frac: float | None = None
    grad_norm: float | None = None
    filtered_rate: float | None = None
    groups: Int | None = None
    group_ids: Ids | None = None
    epochs: Ids | None = None
    train_seconds: float | None = None
    elapsed_s: float | None = None
    samples_per_s: float | None = None
    gate_closed_share: float | None = None
    train_exact_match: float | None = None
    train_reward: float | None = None
    held_out_exact_match: float | None = None
    held_out_reward: float | None = None
    logprob_diff_mean: float | None = None  # |engine - learner| log-probability of the sampled tokens
    logprob_diff_max: float | None = None
    histograms: Annotated[dict[Name, HistogramModel], Field(max_length=HISTOGRAMS_MAX)] | None = None


# HTTP statuses a session server counts (agents/server.py `stats()["status"]`).
AgentStatus = Literal["400", "401", "404", "409", "410", "413", "503"]
AGENT_STATUSES: tuple[str, ...] = get_args(AgentStatus)


class AgentsData(_Data):
    """Per training step of a run with an agent environment (trainer/reports.py `agents_data`): its session
    servers' live sessions per engine, requests waiting at the gate and their cumulative counts; its rollout
    workers' cumulative episode and tool-call counts; the mean of each reward part over the step's trained
    groups. docs/agents.md, "Dashboard and metrics"."""

    step: Int
    sessions: Count
    sessions_per_engine: Annotated[dict[Name, Count], Field(max_length=ENGINES_MAX)]
    waiting: Count
    requests: Count
    tokens: Count
    status: Annotated[dict[AgentStatus, Count], Field(max_length=8)]
    episodes: Count
    tool_calls: Count
    valid_tool_calls: Count
    tool_errors: Count
    reward_parts: Numbers
