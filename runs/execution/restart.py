"""A restart of the platform loses no run. `make run` ends the embedded Ray cluster with the platform, so every
job the platform had running ends with it; the runs those jobs belonged to go back to the queue, not to
`failed`.

- A clean stop (Ctrl-C, SIGTERM of platform/up.py): the jobs are stopped first and each writes a checkpoint (the
  web process still takes its events). Then `runs_interrupted(stopping=True)` puts every starting or running run
  back in the queue, at its old position (the slot keeps its original requested_at), to continue from its latest
  checkpoint: the run waits `queued` while the platform is down.
- The next start (before the tick and the worker): `runs_interrupted(stopping=False)` does the same for every
  starting or running run whose job the new cluster does not know: the platform was killed (SIGKILL, a crash)
  and its Ray went with it, or the stop above did not get that far. Such a run continues from the latest
  checkpoint the platform heard of, else from step 0. Runs whose jobs still exist (a Ray cluster that outlived
  the platform) are reconciled as the tick does: a running job is adopted, an ended one finishes its run.
- Any other time, a job that vanishes fails its run (or auto-resumes it) as before: runs/execution/reconcile.py.

`manage.py runs_interrupted --stopping | --starting` is how platform/up.py calls it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from runs.core.lifecycle import slots_grant
from runs.execution.ray import submission_id_for
from runs.execution.reconcile import JOB_RUNNING, JOB_STOPPED, job_statuses, jobs_observe, run_reconcile
from runs.models import Run, RunStatus
from runs.scheduling.enqueue import run_requeue

if TYPE_CHECKING:
    from ray.job_submission import JobDetails

logger = logging.getLogger(__name__)

STOP_REASON = "the platform stopped while it ran; it continues from its latest checkpoint"
START_REASON = "the platform restarted and its job was gone; it continues from its latest checkpoint"
UNREAD = "job not read"  # what `runs_interrupted` says of a run whose job Ray did not answer for (run unchanged)


def runs_interrupted(*, stopping: bool, observed: dict[int, JobDetails | None] | None = None) -> dict[int, str] | None:
    """Requeue the starting and running runs whose jobs the platform's stop (`stopping`) or restart ended;
    returns {run id: what was done}, or None when Ray's job API does not answer (nothing may be concluded
    from a job's absence then; the runs are left for the tick). At a stop nothing is granted (the platform is
    going down); at a start the freed places are granted at once. `observed`: Ray's view of the launched runs'
    jobs (as `jobs_observe` returns it), read now when not given."""
    runs = list(Run.objects.filter(status__in=(RunStatus.STARTING, RunStatus.RUNNING)).order_by("pk"))
    launched = [r for r in runs if r.ray_submission_id and r.ray_submission_id == submission_id_for(r)]
    launched_ids = {r.pk for r in launched}
    if observed is None:
        observed = jobs_observe(launched)
    if observed is None:
        return None
    statuses = job_statuses(observed)
    done: dict[int, str] = {}
    for run in runs:
        if run.pk not in observed and run.pk in launched_ids:
            done[run.pk] = UNREAD  # its job could not be read: neither alive nor gone (left as it is)
            continue
        info, status = observed.get(run.pk), statuses.get(run.pk)
        ended_by_us = status is None or (stopping and status in (JOB_STOPPED, JOB_RUNNING))
        try:
            if ended_by_us:
                requeued = run_requeue(
                    run=run, reason=STOP_REASON if stopping else START_REASON, interrupted=True, grant=False
                )
                done[run.pk] = "requeued" if requeued is not None else "unchanged"
            elif info is not None:
                done[run.pk] = run_reconcile(run=run, info=info)
        except Exception:  # noqa: BLE001 - one bad run must not keep the others from their place
            logger.exception("run %s: requeue after the platform's %s failed", run.pk, "stop" if stopping else "start")
    if not stopping:
        slots_grant(reason="restart")
    for pk, what in done.items():
        logger.info("run %s: %s after the platform's %s", pk, what, "stop" if stopping else "start")
    return done
