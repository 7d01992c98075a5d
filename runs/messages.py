"""The real-time message types, declared once: channel-layer messages (publishers in runs.core.publish ->
consumers in frontend/) and websocket messages (consumers -> the dashboard's TypeScript). Django-free.

Events themselves are `trainer.events.StoredEvent` (the emitter's module), their `data` the trainer's pydantic
models (trainer/event_schema.py); the run summary is runs.summary_types.RunSummary. The TypeScript twin of all
of them is generated: `python -m runs.telemetry.messages_ts > frontend/static/src/lib/messages.ts` (a test compares).
Wire formats and rules: docs/realtime.md.
"""

from __future__ import annotations

from typing import Any, Literal, Required, TypedDict

from runs.summary_types import BoardSummary, RunSummary
from trainer.events import StoredEvent

# --- shared shapes -------------------------------------------------------------------------------------


class ClassSlots(TypedDict):
    running: int
    waiting: int
    limit: int
    priority: int
    gpu_limit: int | None
    gpus: float  # GPUs the class's held runs hold


class ClassPolicy(TypedDict):
    limit: int
    priority: int
    gpu_limit: int | None


class SlotPolicy(TypedDict):
    max_total: int
    interactive_reserve: int
    classes: dict[str, ClassPolicy]


class SlotTotal(TypedDict):
    running: int
    max_total: int


class ClusterJson(TypedDict):
    """The cluster as admission sees it (runs.telemetry.dashboard.cluster_snapshot): whether the last read of Ray
    worked, the alive nodes, their total resources and what the held runs leave free (Ray JSON units)."""

    reachable: bool
    nodes: int
    total: dict[str, float]
    free: dict[str, float]


class SlotsJson(TypedDict):
    """GET /api/slots/ and the `slots` of every dashboard message."""

    policy: SlotPolicy
    borrowable: int
    classes: dict[str, ClassSlots]
    total: SlotTotal


class Position(TypedDict):
    in_class: int
    overall: int


class RunJson(TypedDict):
    """The REST run JSON (GET /api/runs/<id>/), built by runs.selectors.run_json."""

    id: int
    name: str
    origin: str
    run_class: str
    kind: str
    status: str
    owner: str
    config: dict[str, Any]  # free-form: each run kind's own keys (its schema checked them at submit)
    created_at: str
    granted_at: str | None
    started_at: str | None
    finished_at: str | None
    queued_seconds: float
    position: Position | None
    pending_reason: str | None
    pending_detail: dict[str, Any] | None
    eta_seconds: float | None
    progress: float | None  # steps done / steps total (0..1); null before the first train event
    eta_finish_seconds: float | None  # a running run's predicted seconds to its finish; null when not known
    error: str
    summary: RunSummary
    auto_resume: bool
    time_limit_seconds: int | None
    resources: dict[str, Any] | None  # the demand: {bundles: [{role, CPU, GPU, memory}], total, strategy}
    preempted_by: int | None  # its latest preemption (docs/slots.md "Preemption"): for which run
    preempt_state: str  # "" (never preempted) | requested | preempted | resumed | ended
    preempt_reason: str


class CompareRun(TypedDict):
    """One run of GET /api/runs/compare/: its train metrics as columns, at most COMPARE_POINTS_MAX points
    (every `stride`-th train event, always the last one), `elapsed` in seconds since the run started."""

    id: int
    name: str
    owner: str
    status: str
    steps: int  # train events stored
    stride: int
    step: list[int]
    elapsed: list[float]
    metrics: dict[str, list[float | None]]  # every numeric scalar of the train events' data


class ConfigDiffRow(TypedDict):
    """A config key (nested keys dotted) whose value is not the same in every compared run."""

    key: str
    values: list[Any]  # per run, in the runs' order; null where the run lacks the key (see `missing`)
    missing: list[bool]


class CompareJson(TypedDict):
    """GET /api/runs/compare/?runs=1,2,3 (runs.telemetry.compare): visible runs in the asked order; `not_found`: ids
    that do not exist or that the user may not see (the two are not told apart)."""

    runs: list[CompareRun]
    not_found: list[int]
    metrics: list[str]
    config_diff: list[ConfigDiffRow]


class BoardRun(TypedDict, total=False):
    """A run as the board draws it: the run JSON without config, the summary cut to what a row shows,
    `requested_at` (seconds) of a queued run's slot (its place in grant order), the active runs' reward
    history. A queued row (runs.telemetry.dashboard.queue_rows) carries only the required keys."""

    id: Required[int]
    name: Required[str]
    origin: Required[str]
    run_class: Required[str]
    kind: Required[str]
    status: Required[str]
    owner: Required[str]
    created_at: Required[str]
    granted_at: str | None
    started_at: str | None
    finished_at: str | None
    queued_seconds: float
    position: Required[Position | None]
    pending_reason: Required[str | None]
    pending_detail: Required[dict[str, Any] | None]
    eta_seconds: Required[float | None]
    progress: float | None
    eta_finish_seconds: float | None
    error: str
    summary: BoardSummary
    requested_at: Required[float | None]
    preempted_by: int | None  # active rows: the run JSON's preemption fields
    preempt_state: str
    preempt_reason: str
    reward_history: list[float]


class QueueKey(TypedDict):
    """A waiting slot's place in grant order, without naming the run: class, then `requested_at`; `at`: when
    the move was committed (seconds), so a consumer skips moves its snapshot already shows."""

    run_class: str
    requested_at: float
    at: float


class QueueChange(TypedDict):
    """What moved in the waiting line since the previous `slots` message, whatever the queue length:
    slots that joined and left (grant or cancel), each class's pending reason, and what the ETAs are built
    from: the held runs' predicted finishes (seconds since the epoch, ascending) and a typical run's duration
    (seconds; null: not known), else the grant rate (per second; null when nothing was granted lately)."""

    joined: list[QueueKey]
    left: list[QueueKey]
    reasons: dict[str, str]
    rate: float | None
    finishes: list[float]
    run_seconds: float | None


class StatusMoveData(TypedDict):
    """`data` of a stored `status` event: one move of the platform's state machine (written by runs.core.lifecycle's
    stores and runs.scheduling.enqueue). A job's own reports of its state are stored as `job_status` events, with the
    trainer's StatusData (runs.core.events.stored_type)."""

    status: str
    previous: str | None  # null for the first move (submitted: queued)
    error: str


def status_move_data(*, status: str, previous: str | None, error: str) -> StatusMoveData:
    """The `data` of a `status` event, built in Python (runs.core.moves, runs.scheduling.enqueue)."""
    return StatusMoveData(status=status, previous=previous, error=error)


def status_move_data_sql(**exprs: str) -> str:
    """The same `data` built by PostgreSQL (runs/slots/pg_writes.py): `jsonb_build_object` over one SQL expression
    per key of StatusMoveData, in its order. The keys come from the TypedDict, so a key added there and not given
    here fails when the statement is built, and the two builders cannot drift."""
    keys = list(StatusMoveData.__annotations__)
    if sorted(exprs) != sorted(keys):
        raise ValueError(f"a status event's data needs exactly {keys}, got {sorted(exprs)}")
    return "jsonb_build_object(" + ", ".join(f"'{key}', {exprs[key]}" for key in keys) + ")"


# --- channel-layer messages (runs.core.publish -> frontend consumers) ---------------------------------------


class RunEventsLayer(TypedDict):
    type: Literal["run.events"]
    events: list[StoredEvent]


class RunUpdateLayer(TypedDict):
    type: Literal["run.update"]
    run: BoardRun
    owner_id: int
    last_seq: int


class SlotsUpdateLayer(TypedDict):
    type: Literal["slots.update"]
    slots: SlotsJson
    queue: QueueChange
    # When the policy (or the cluster's reachability) last changed, as a commit time, or None: positions are
    # recomputed, so a consumer whose snapshot is older sends a fresh one; a newer snapshot already shows it.
    resync_at: float | None


class SessionEndedLayer(TypedDict):
    type: Literal["session.ended"]
    session: str  # SHA-256 of the session key


class UserChangedLayer(TypedDict):
    type: Literal["user.changed"]


# --- websocket messages: /ws/runs/<id>/ -----------------------------------------------------------------


class RunSnapshotMsg(TypedDict):
    type: Literal["snapshot"]
    run: RunJson
    last_seq: int


class EventsMsg(TypedDict):
    type: Literal["events"]
    events: list[StoredEvent]


class TruncatedMsg(TypedDict):
    type: Literal["truncated"]
    after: int
    through: int


# --- websocket messages: /ws/dashboard/ -----------------------------------------------------------------


class DashboardSnapshotMsg(TypedDict):
    type: Literal["snapshot"]
    slots: SlotsJson
    cluster: ClusterJson
    queue: list[BoardRun]
    active: list[BoardRun]


class DashboardRunMsg(TypedDict):
    type: Literal["run"]
    run: BoardRun


class DashboardSlotsMsg(TypedDict):
    type: Literal["slots"]
    slots: SlotsJson
    queue: QueueChange
