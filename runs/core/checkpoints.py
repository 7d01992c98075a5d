"""What the platform knows of a run's checkpoints: the step of the latest one a resume would continue from.

The platform learns of checkpoints from the job's `checkpoint` events (trainer/resume.py): `state` "saved" (or
no `state`, as older jobs sent) is a checkpoint written, "failed" one that was not; `reason` "restored" is a
resumed job that loaded one. The run summary keeps the latest checkpoint event's data even when the event
budget no longer stores events (runs/telemetry/retention.py), so it is read first; the stored events answer when the
latest one failed after an earlier one was saved. The job reads the same directory's `latest` marker, so the
step named here is the one a resume restarts at. The web process never reads checkpoint files itself (in
production it may not mount RUN_ARTIFACTS_DIR).
"""

from __future__ import annotations

from typing import Any

from runs.models import Run, RunEvent

# Checkpoint events read back when the summary's latest one is not usable: failures are rare, so the latest
# good one is among the last few; a job posting more failures than this has no checkpoint to offer anyway.
SCAN_MAX = 200


def checkpoint_step(data: Any) -> int | None:
    """The step of a usable checkpoint event's data, or None (failed, or not a checkpoint report)."""
    if not isinstance(data, dict):
        return None
    step = data.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    if data.get("reason") == "restored" or data.get("state", "saved") == "saved":
        return step
    return None


def run_checkpoint_step(run: Run) -> int | None:
    """The step of the run's latest usable checkpoint, or None when it has none to resume from."""
    summary = run.summary if isinstance(run.summary, dict) else {}
    step = checkpoint_step(summary.get("checkpoint"))
    if step is not None:
        return step
    stored = RunEvent.objects.filter(run_id=run.pk, type="checkpoint").order_by("-seq")
    for data in stored.values_list("data", flat=True)[:SCAN_MAX]:
        step = checkpoint_step(data)
        if step is not None:
            return step
    return None
