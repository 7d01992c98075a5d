"""The after-commit effects of lifecycle moves, typed per kind, and the Celery task that does each.

runs.core.lifecycle decides which effects a move implies (a grant: `Dispatch`; a cancel: `StopJob`; a finish:
`FollowUps`, `StopJob` when the platform ended the run, `WebhookStatus` when a webhook is told of it) and
stores them in the move's transaction (runs/outbox/store.py); runs/webhooks/emit.py stores a `Webhook` per
webhook delivery in its event's. The drainer (runs/outbox/drain.py) hands each to its task after the commit.
Each names its run and the time of the move that implied it (the run's `granted_at`, its `finished_at`, the
cancel's time), and that makes its key: a run granted again after a requeue needs a new launch, a run finished
again after a resume new follow-ups, while the same move stored twice is one effect.

The tasks are named, not imported: runs.tasks, the entry points, sits above runs.core.lifecycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, TypedDict

TASK_DISPATCH = "runs.tasks.dispatch_run"
TASK_STOP = "runs.tasks.stop_run"
TASK_FOLLOWUPS = "runs.tasks.run_followups"
TASK_WEBHOOK = "runs.webhooks.tasks.deliver"
TASK_WEBHOOK_STATUS = "runs.webhooks.tasks.status_fanout"


class Payload(TypedDict, total=False):
    """The stored payload: the run and the time of the move (ISO 8601, with its offset), for every kind; the
    job's submission id for a stop."""

    run: int
    at: str
    job: str
    delivery: str


@dataclass(frozen=True)
class RunEffect:
    run_id: int
    at: datetime  # the time of the move that implies it (aware)

    kind: ClassVar[str]
    task: ClassVar[str]
    # True: a database write, run by the drainer in its own process, in the transaction that marks it done.
    # False: sent to a Celery worker (the drainer marks it done once sent; the task is idempotent).
    here: ClassVar[bool]

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.run_id}:{self.at.isoformat()}"

    def payload(self) -> Payload:
        return {"run": self.run_id, "at": self.at.isoformat()}

    def args(self) -> tuple[Any, ...]:
        """The task's arguments (a Celery message's: JSON)."""
        return (self.run_id,)


@dataclass(frozen=True)
class Dispatch(RunEffect):
    """Launch a granted run on Ray (`runs.tasks.dispatch_run`: skips a run no longer `starting`; a second
    launch of the same attempt finds its Ray job by submission id)."""

    kind: ClassVar[str] = "dispatch"
    task: ClassVar[str] = TASK_DISPATCH
    here: ClassVar[bool] = False


@dataclass(frozen=True)
class StopJob(RunEffect):
    """Stop the job the run had at the move (`runs.tasks.stop_run`: a job already stopped or unknown to Ray is
    left alone). `job` is that attempt's Ray submission id: by the time the effect is done the run may have
    moved on to a new attempt (an automatic resume after a platform-ended finish), and it is the old job that
    must stop. Empty: the run had no job then (a row stored before the id was carried reads the same)."""

    job: str = ""

    kind: ClassVar[str] = "stop"
    task: ClassVar[str] = TASK_STOP
    here: ClassVar[bool] = False

    def payload(self) -> Payload:
        return {"run": self.run_id, "at": self.at.isoformat(), "job": self.job}

    def args(self) -> tuple[Any, ...]:
        return (self.run_id, self.job)


@dataclass(frozen=True)
class FollowUps(RunEffect):
    """What follows a finish (`runs.tasks.run_followups`: an evaluation after a success, an automatic resume
    after a failure), applied only while the run is still in the finish that implied it (its finished_at)."""

    kind: ClassVar[str] = "followups"
    task: ClassVar[str] = TASK_FOLLOWUPS
    here: ClassVar[bool] = True

    def args(self) -> tuple[Any, ...]:
        return (self.run_id, self.at.isoformat())


@dataclass(frozen=True)
class Webhook(RunEffect):
    """POST one webhook delivery (`runs.webhooks.tasks.deliver`: retries itself until its receiver accepts, each
    attempt logged). `delivery` is the delivery row's uuid, stored in the transaction of the event it tells:
    one effect per delivery, whatever the event's time (run_id 0: a test delivery, of no run)."""

    delivery: str = ""

    kind: ClassVar[str] = "webhook"
    task: ClassVar[str] = TASK_WEBHOOK
    here: ClassVar[bool] = False

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.delivery}"

    def payload(self) -> Payload:
        return {"run": self.run_id, "at": self.at.isoformat(), "delivery": self.delivery}

    def args(self) -> tuple[Any, ...]:
        return (self.delivery,)


@dataclass(frozen=True)
class WebhookStatus(RunEffect):
    """Tell a finish to the webhooks subscribed to it (`runs.webhooks.tasks.status_fanout`: their deliveries,
    written in the drainer's transaction). Stored with the move, as PostgreSQL may write a finish in one
    statement of its own (runs/slots/pg.py); runs/webhooks/emit.py stores it only when a subscription matches."""

    kind: ClassVar[str] = "hookstatus"
    task: ClassVar[str] = TASK_WEBHOOK_STATUS
    here: ClassVar[bool] = True

    def args(self) -> tuple[Any, ...]:
        return (self.run_id, self.at.isoformat())


KINDS: dict[str, type[RunEffect]] = {cls.kind: cls for cls in (Dispatch, StopJob, FollowUps, Webhook, WebhookStatus)}
EXTRA_KEYS: dict[type[RunEffect], str] = {StopJob: "job", Webhook: "delivery"}


def effect_load(kind: str, payload: object) -> RunEffect:
    """The typed effect of a stored row. ValueError for a kind this code does not know (the drainer never
    claims one) or a payload that is not of its kind: such a row can never be done."""
    cls = KINDS.get(kind)
    if cls is None:
        raise ValueError(f"unknown effect kind {kind!r}")
    extra = EXTRA_KEYS.get(cls)
    keys = {"run", "at", extra} if extra else {"run", "at"}
    if not isinstance(payload, dict) or not {"run", "at"} <= set(payload) <= keys:
        raise ValueError(f"{kind} payload must be {{{', '.join(sorted(keys))}}}, not {payload!r}")
    run, at, job = payload["run"], payload["at"], payload.get(extra, "") if extra else ""
    if not isinstance(run, int) or isinstance(run, bool) or not isinstance(at, str) or not isinstance(job, str):
        raise ValueError(f"{kind} payload: run must be an integer, at and job strings, not {payload!r}")
    moment = datetime.fromisoformat(at)
    if moment.tzinfo is None:
        raise ValueError(f"{kind} payload: at must carry its offset, not {at!r}")
    if cls is StopJob:
        return StopJob(run_id=run, at=moment, job=job)
    if cls is Webhook:
        return Webhook(run_id=run, at=moment, delivery=job)
    return cls(run_id=run, at=moment)
