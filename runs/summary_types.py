"""The run summary, declared once: `Run.summary` as runs.telemetry.ingest.summary_fold builds it (the run JSON carries
it whole) and the cut of it a board row draws (runs.telemetry.dashboard.board_summary). Django-free; the dashboard's
TypeScript twin is generated with runs/messages.py's (runs.telemetry.messages_ts).

The summary keeps the latest `data` of each event type in `SummaryType`, under the type's name. That data is
the JSON of the type's pydantic model (trainer/step_schema.py, trainer/lifecycle_schema.py: what ingest stored),
written `Annotated[dict[str, Any], Model]`: a dict to mypy, the model's interface in the TypeScript.
Formats: docs/realtime.md ("Summary folding").
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypedDict, TypeGuard, get_args

from trainer.lifecycle_schema import CheckpointData
from trainer.step_schema import AgentsData, GateData, SamplerData, TrainData, VersionData

# Event types whose latest `data` the summary keeps, under the same key.
SummaryType = Literal["gate", "version", "sampler", "train", "checkpoint", "agents"]
SUMMARY_TYPES: frozenset[str] = frozenset(get_args(SummaryType))


def is_summary_type(etype: str) -> TypeGuard[SummaryType]:
    return etype in SUMMARY_TYPES


class ProgressSummary(TypedDict, total=False):
    """`summary.progress` (runs.scheduling.progress.progress_fold): the recent train events the finish ETA is built
    from."""

    points: list[list[float]]  # the newest train events' [ts, step, evaluation seconds]
    eval_s: float | None  # the latest evaluation's seconds
    clock: float  # training seconds since the first train event, evaluations out
    marks: list[list[float]]  # the run's pace profile: [tenth, step, clock] (runs/scheduling/pace.py)


class RunHistogram(TypedDict):
    """One of `summary.hist` (runs/telemetry/prometheus/run_hist.py): counts per bucket of its metric (+Inf last)."""

    buckets: list[int]
    sum: float
    count: int


class RunSummary(TypedDict, total=False):
    """`Run.summary`: the latest data of each summarized event type, the finish ETA's inputs (`progress`), the
    per-run histograms of /metrics (`hist`), the newest event's time and an eval run's final metrics (`eval`,
    runs.execution.outcome). A key is absent until its first event."""

    gate: Annotated[dict[str, Any], GateData]
    version: Annotated[dict[str, Any], VersionData]
    sampler: Annotated[dict[str, Any], SamplerData]
    train: Annotated[dict[str, Any], TrainData]
    checkpoint: Annotated[dict[str, Any], CheckpointData]
    agents: Annotated[dict[str, Any], AgentsData]
    progress: ProgressSummary
    hist: dict[str, RunHistogram]
    last_event_at: float  # seconds since the epoch
    eval: dict[str, float | bool | str | None]


class BoardGate(TypedDict):
    state: str | None


class BoardVersion(TypedDict):
    version: int | None


class BoardSampler(TypedDict, total=False):
    """The sampler fields a board row draws: SamplerData's, each present when the run reported it."""

    epoch: int | None
    group_count: int | None
    dataset_size: int | None
    consumed_in_epoch: int | None


class BoardTrain(TypedDict):
    reward_mean: float | None
    step: int | None


class BoardSummary(TypedDict):
    """What a board row draws of a run summary: gate state, weight version, sampler progress, latest reward and
    step, each null where the run has not reported it (so a row stays small whatever a job posted)."""

    gate: BoardGate
    version: BoardVersion
    sampler: BoardSampler
    train: BoardTrain
