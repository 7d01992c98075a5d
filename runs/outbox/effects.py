"""The after-commit effects of lifecycle moves, typed per kind, and the Celery task that does each.

runs.lifecycle decides which effects a move implies (a grant: `Dispatch`; a cancel: `StopJob`; a finish:
`FollowUps`, and `StopJob` when the platform ended the run) and stores them in the move's transaction
(runs/outbox/store.py); the drainer (runs/outbox/drain.py) hands each to its task after the commit. Each names
its run and the time of the move that implied it (the run's `granted_at`, its `finished_at`, the cancel's time),
and that makes its key: a run granted again after a requeue needs a new launch, a run finished again after a
resume new follow-ups, while the same move stored twice is one effect.

The tasks are named, not imported: runs.tasks, the entry points, sits above runs.lifecycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, TypedDict

TASK_DISPATCH = "runs.tasks.dispatch_run"
TASK_STOP = "runs.tasks.stop_run"
TASK_FOLLOWUPS = "runs.tasks.run_followups"


class Payload(TypedDict):
    """The stored payload of every kind: the run and the time of the move (ISO 8601, with its offset)."""

    run: int
    at: str


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
    """Stop the run's job (`runs.tasks.stop_run`: a job already stopped or unknown to Ray is left alone)."""

    kind: ClassVar[str] = "stop"
    task: ClassVar[str] = TASK_STOP
    here: ClassVar[bool] = False


@dataclass(frozen=True)
class FollowUps(RunEffect):
    """What follows a finish (`runs.tasks.run_followups`: an evaluation after a success, an automatic resume
    after a failure), applied only while the run is still in the finish that implied it (its finished_at)."""

    kind: ClassVar[str] = "followups"
    task: ClassVar[str] = TASK_FOLLOWUPS
    here: ClassVar[bool] = True

    def args(self) -> tuple[Any, ...]:
        return (self.run_id, self.at.isoformat())


KINDS: dict[str, type[RunEffect]] = {cls.kind: cls for cls in (Dispatch, StopJob, FollowUps)}


def effect_load(kind: str, payload: object) -> RunEffect:
    """The typed effect of a stored row. ValueError for a kind this code does not know (the drainer never
    claims one) or a payload that is not of its kind: such a row can never be done."""
    cls = KINDS.get(kind)
    if cls is None:
        raise ValueError(f"unknown effect kind {kind!r}")
    if not isinstance(payload, dict) or set(payload) != {"run", "at"}:
        raise ValueError(f"{kind} payload must be {{run, at}}, not {payload!r}")
    run, at = payload["run"], payload["at"]
    if not isinstance(run, int) or isinstance(run, bool) or not isinstance(at, str):
        raise ValueError(f"{kind} payload: run must be an integer and at a string, not {payload!r}")
    moment = datetime.fromisoformat(at)
    if moment.tzinfo is None:
        raise ValueError(f"{kind} payload: at must carry its offset, not {at!r}")
    return cls(run_id=run, at=moment)
