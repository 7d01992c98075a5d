"""The platform's preemption events on a run's stream (docs/slots.md "Preemption"): their type names and the
shape of each one's `data`, declared once for the writer (runs/execution/preempt.py) and the dashboard (generated
into lib/messages.ts by runs/telemetry/messages_ts.py). Jobs cannot post these types: ingest accepts only the
trainer's event types."""

from __future__ import annotations

from typing import TypedDict

PREEMPT_REQUESTED = "preempt_requested"
PREEMPTED = "preempted"
RESUMED = "resumed"
PREEMPT_EVENT_TYPES = (PREEMPT_REQUESTED, PREEMPTED, RESUMED)


class PreemptRequestedData(TypedDict):
    """The run was chosen as a victim: its job is asked to checkpoint and stop within `grace_seconds`."""

    by: int  # the waiting run it makes room for
    reason: str
    grace_seconds: int
    deadline: float  # seconds since the epoch: stopped hard then
    step: int | None  # the latest trained step the platform knew at the request
    checkpoint_step: int | None  # its latest checkpoint then


class PreemptedData(TypedDict):
    """The run is back in the queue (at its old place): it resumes from `checkpoint_step` when granted again."""

    by: int | None
    outcome: str  # checkpointed (stopped within the grace period) | stopped_hard
    step: int | None  # the latest trained step the platform knew when it stopped
    checkpoint_step: int | None  # where it resumes (None: from step 0)
    lost_steps: int  # trained steps after that checkpoint: the work lost (0 when it checkpointed)
    seconds: float  # from the request to the requeue


class ResumedData(TypedDict):
    """The preempted run's next attempt reported running."""

    from_step: int | None  # the checkpoint it resumed from (None: step 0)
    attempt: int
    waited_seconds: float  # from the requeue to running again
