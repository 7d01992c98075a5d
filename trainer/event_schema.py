"""Each event type's `data`, declared once: its fields, their types and their bounds (pydantic models, strict:
no coercion, finite numbers only). Shared by the trainer (its emitter checks every event it sends) and the
platform (ingest keeps only what is declared here; the board, compare and trace read only declared fields).

`data_clean(type, data)` validates and returns the declared fields that were given: unknown fields are dropped,
a wrong type or an over-long string, list or map is refused (EventSchemaError naming the field's path).
Why pydantic: it was already installed (Ray depends on it), it validates in compiled code (a 1,000-event batch
costs milliseconds) and its errors carry the field's location as data, which is what a 400 must name.
docs/realtime.md, "Event schema".
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StringConstraints, ValidationError

from trainer.sample_schema import SampleModel

NAME_MAX = 64  # characters of a name: an engine, worker, node, metric, state, level, reason
TEXT_MAX = 4000  # characters of free text: an error, a log message, a detail, a path
ENGINES_MAX = 32  # engines of a gate event, names in an engine list or a span map (num_engines/workers <= 16)
NODES_MAX = 64  # node ids of a `resources` event (one per bundle, and the driver's)
IDS_MAX = 1024  # group ids (and their epochs) of one rollout batch or train step (prompts_per_step <= 512)
MAP_MAX = 64  # entries of a name -> number map (metrics, dropped-by-filter counts, channel counters)
HISTOGRAMS_MAX = 8
HISTOGRAM_BUCKETS_MAX = 64
PHASES_MAX = 8
URL_MAX = 200  # characters of a `serving` event's URL
# `http://<IPv4 or [IPv6]>:<port>`, nothing else: no name to resolve, no user info, no path, query or fragment.
SERVING_URL_PATTERN = r"^http://(\d{1,3}(\.\d{1,3}){3}|\[[0-9A-Fa-f:.]{2,45}\]):\d{1,5}/?$"
INT_MAX = 2**62  # integers stay well inside a signed 64-bit column and a JSON number

Name = Annotated[str, StringConstraints(max_length=NAME_MAX)]
Text = Annotated[str, StringConstraints(max_length=TEXT_MAX)]
Int = Annotated[int, Field(ge=-INT_MAX, le=INT_MAX)]
Count = Annotated[int, Field(ge=0, le=INT_MAX)]  # how many of something: never negative
Names = Annotated[list[Name], Field(max_length=ENGINES_MAX)]
Ids = Annotated[list[Int], Field(max_length=IDS_MAX)]
Counts = Annotated[dict[Name, Int], Field(max_length=MAP_MAX)]
Numbers = Annotated[dict[Name, float], Field(max_length=MAP_MAX)]


def _metric(value: Any) -> Any:
    """A metric's value: a finite number, true/false, null, or (an eval job's `task`) a name."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and -INT_MAX <= value <= INT_MAX:
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, str) and len(value) <= NAME_MAX:
        return value
    raise ValueError(f"expected a finite number, true/false, null or a string of at most {NAME_MAX} characters")


Metrics = Annotated[dict[Name, Annotated[Any, PlainValidator(_metric)]], Field(max_length=MAP_MAX)]


class _Data(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, frozen=True)


class SpanModel(_Data):
    start: float
    end: float


Spans = Annotated[dict[Name, SpanModel], Field(max_length=ENGINES_MAX)]


class StatusData(_Data):
    status: Name
    previous: Name | None = None  # the platform's moves
    error: Text | None = None
    version: Int | None = None
    metrics: Metrics | None = None


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


class WorkerData(_Data):
    event: Name
    workers: Int | None = None  # the job's `started` event: its topology and where the learner runs
    mode: Name | None = None
    device: Name | None = None
    num_gpus: float | None = None
    engine: Name | None = None
    engines: Names | None = None
    tombstoned_sessions: Int | None = None
    version: Int | None = None
    restarts: Int | None = None
    error: Text | None = None


class CheckpointData(_Data):
    step: Int | None = None
    version: Int | None = None
    reason: Name | None = None
    state: Name | None = None
    path: Text | None = None
    error: Text | None = None
    seconds: float | None = None
    span: SpanModel | None = None
    in_flight: Int | None = None  # the quiesce's counts (rollout.scheduler quiesce)
    rebuffered: Int | None = None
    finished: Int | None = None


class LogData(_Data):
    level: Name | None = None
    message: Text | None = None
    eval: Metrics | None = None  # an eval job's metrics
    control: Int | None = None  # the platform's note of a staff command (runs/controls.py)


class ResourcesData(_Data):
    state: Name
    strategy: Name | None = None
    waited_s: float | None = None
    nodes: Annotated[list[Name], Field(max_length=NODES_MAX)] | None = None
    detail: Text | None = None


class ServingData(_Data):
    """Where the run's session server listens (agents/server.py; the platform proxies to it: docs/api.md).
    The platform keeps the URL only when its host is a node of its Ray cluster or loopback (runs/serving.py)."""

    url: Annotated[str, StringConstraints(max_length=URL_MAX, pattern=SERVING_URL_PATTERN)]
    model: Name


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


class ControlData(_Data):
    id: Int
    kind: Name
    outcome: Name
    detail: Text


DATA_MODELS: dict[str, type[BaseModel]] = {
    "status": StatusData,
    "gate": GateData,
    "version": VersionData,
    "sampler": SamplerData,
    "rollout": RolloutData,
    "train": TrainData,
    "worker": WorkerData,
    "checkpoint": CheckpointData,
    "log": LogData,
    "resources": ResourcesData,
    "sample": SampleModel,
    "control": ControlData,
    "serving": ServingData,
    "agents": AgentsData,
}
# Free-text fields an emitter cuts to TEXT_MAX rather than fail its run on (an exception's text can be long).
TEXT_FIELDS: dict[str, tuple[str, ...]] = {
    "status": ("error",),
    "log": ("message",),
    "worker": ("error",),
    "checkpoint": ("error", "path"),
    "control": ("detail",),
    "resources": ("detail",),
}


def required_keys(etype: str) -> frozenset[str]:
    """The fields of `etype`'s data that every event of it carries."""
    fields = DATA_MODELS[etype].model_fields
    return frozenset(name for name, info in fields.items() if info.is_required())


def declared_keys(etype: str) -> frozenset[str]:
    return frozenset(DATA_MODELS[etype].model_fields)


class DataSchemaError(ValueError):
    """`data` breaks its type's schema: `field` is the path (e.g. `data.engines[3].state`), `reason` why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def data_clean(etype: str, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with only its declared fields (those given); DataSchemaError naming the first bad field."""
    try:
        model = DATA_MODELS[etype].model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        raise DataSchemaError(_path(first["loc"]), first["msg"].removeprefix("Value error, ")) from None
    return model.model_dump(exclude_unset=True)


def data_fit(etype: str, data: dict[str, Any]) -> dict[str, Any]:
    """An emitter's data with its free-text fields cut to TEXT_MAX characters (nothing else changes)."""
    keys = [k for k in TEXT_FIELDS.get(etype, ()) if isinstance(data.get(k), str) and len(data[k]) > TEXT_MAX]
    if not keys:
        return data
    return {**data, **{k: data[k][: TEXT_MAX - 3] + "..." for k in keys}}


def _path(loc: tuple[int | str, ...]) -> str:
    """`data.a[3].b`; map keys are posted text, so each is cut to NAME_MAX characters (`[key]` marks a bad key)."""
    out = "data"
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "[key]":
            out += "." + (part if len(part) <= NAME_MAX else part[:NAME_MAX] + "...")
    return out
