"""The `data` of the events about the run itself rather than one training step (registered by type in
trainer/event_schema.py): its `status`, its processes (`worker`), its `checkpoint`s, `log` lines, its placement
(`resources`), where its session server listens (`serving`) and the answers to staff commands (`control`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from trainer.event_fields import (
    NODES_MAX,
    SERVING_URL_PATTERN,
    URL_MAX,
    Int,
    Metrics,
    Name,
    Names,
    SpanModel,
    Text,
    _Data,
)


class StatusData(_Data):
    """The job's own report of its state (running, stopping, succeeded, failed, cancelled). The platform stores
    it as a `job_status` event: its stored `status` events are its own moves of the run (runs/core/events.py)."""

    status: Name
    error: Text | None = None
    version: Int | None = None
    metrics: Metrics | None = None


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
    control: Int | None = None  # the platform's note of a staff command (runs/execution/controls.py)


class ResourcesData(_Data):
    state: Name
    strategy: Name | None = None
    waited_s: float | None = None
    nodes: Annotated[list[Name], Field(max_length=NODES_MAX)] | None = None
    detail: Text | None = None


class ServingData(_Data):
    """Where the run's session server listens (agents/server.py; the platform proxies to it: docs/api.md).
    The platform keeps the URL only when its host is a node of its Ray cluster or loopback
    (runs/execution/serving.py)."""

    url: Annotated[str, StringConstraints(max_length=URL_MAX, pattern=SERVING_URL_PATTERN)]
    model: Name


class ControlData(_Data):
    id: Int
    kind: Name
    outcome: Name
    detail: Text
