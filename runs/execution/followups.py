"""What follows a finished run: a succeeded `rl_train` run gets an `eval` run (origin `system`, same owner,
parent = the run), a failed run with `auto_resume` is resumed (at most RUN_AUTO_RESUME_MAX attempts), however
it failed (job, reclaim, time limit, launch error). runs.core.lifecycle.run_finish stores a `FollowUps` effect in the
finishing transaction; the outbox's drainer runs `runs.tasks.run_followups` for it once that commits, in the
transaction that marks the effect done (runs/outbox/drain.py), so this happens once per finish."""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.db import transaction

from runs.audit.record import PLATFORM_ACTOR
from runs.core.checkpoints import run_checkpoint_step
from runs.execution.kinds import DEFAULT_KIND, EVAL_KIND
from runs.execution.submit import run_submit
from runs.models import Origin, Run, RunStatus
from runs.scheduling.enqueue import run_resume
from runs.slots import store

logger = logging.getLogger(__name__)


def eval_run_submit(*, run: Run) -> Run | None:
    """Submit the evaluation of a succeeded training run once (racing finalizers: the grant lock decides).
    Not refused by the owner's per-user caps: it replaces the training run that just finished, one for one."""
    with transaction.atomic():
        store.slots_lock()
        if Run.objects.filter(parent=run, origin=Origin.SYSTEM, kind=EVAL_KIND).exists():
            return None
        return run_submit(
            owner=run.owner,
            actor=PLATFORM_ACTOR,
            name=f"eval of {run.name}"[:200],
            origin=Origin.SYSTEM,
            kind=EVAL_KIND,
            config={"source_run": run.pk},
            parent=run,
            user_caps=False,
        )


def run_followups(*, run_id: int, finished_at: datetime) -> str:
    """Apply the follow-ups of the finish of a run at `finished_at`: nothing when the run is no longer in that
    finish (resumed or requeued since: "stale"). Idempotent besides: the eval run is submitted once, however
    many finalizers race."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or run.finished_at != finished_at:
        return "stale"
    if run.status == RunStatus.SUCCEEDED and run.kind == DEFAULT_KIND:
        child = eval_run_submit(run=run)
        if child is None:
            return "evaluation exists"
        logger.info("run %s succeeded: submitted eval run %s", run.pk, child.pk)
        return "evaluation submitted"
    if run.status == RunStatus.FAILED and run.auto_resume and run.attempt < settings.RUN_AUTO_RESUME_MAX:
        # Without a checkpoint (it failed before its first one), auto-resume starts it over from step 0: there
        # is no progress to lose, and RUN_AUTO_RESUME_MAX bounds the retries.
        step = run_checkpoint_step(run)
        run_resume(run=run, by="the platform (auto-resume)", user_caps=False, from_scratch=step is None)
        where = f"from its checkpoint at step {step}" if step is not None else "from step 0 (no checkpoint)"
        logger.info("run %s failed: resumed automatically %s (attempt %s)", run.pk, where, run.attempt + 1)
        return "resumed" if step is not None else "restarted"
    return "nothing to do"
