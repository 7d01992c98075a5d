"""Liveness of `starting` runs and node loss, decided from what Ray says (docs/execution.md, "Liveness").

A `starting` run is granted and charged but not placed yet; its liveness is its Ray job's status, not a
heartbeat: PENDING/RUNNING is alive; a job Ray does not know is launched again (lost launch), never failed;
a run still not `running` RUN_LAUNCH_TIMEOUT_SECONDS after its grant (or after Ray was reachable again, when
an outage came after the grant) fails "launch timeout ..."; a run whose job
never posted anything by its placement timeout (+ RUN_PLACEMENT_MARGIN_SECONDS) goes back to the queue, as the
job's own `timeout` event would have put it. A node Ray reports dead or no longer lists ends the runs placed on
it. The tick calls these only while Ray is reachable: an outage of the head fails nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime

from django.conf import settings
from django.db import transaction

from runs.core.lifecycle import run_finish
from runs.execution import ray
from runs.execution.capacity import reachable_since
from runs.execution.launch import job_submission_stop
from runs.models import ClusterNode, Run, RunStatus, Slot, SlotState
from runs.scheduling.enqueue import run_requeue
from runs.slots import store as slot_store

logger = logging.getLogger(__name__)

# A granted run whose current attempt has no Ray job this long after its grant is launched again (its launch
# was lost); launches are idempotent (submission id = run + attempt), so a second launch of a live job is a no-op.
RELAUNCH_AFTER_SECONDS = 30
# The trainer's default placement_timeout_s (trainer/config.py), for runs whose config does not set one.
PLACEMENT_TIMEOUT_DEFAULT = 300.0

# Ray job status of each observed run's current attempt: a JobStatus value, or None when Ray does not know it.
Jobs = Mapping[int, "str | None"]


def has_placement_group(run: Run) -> bool:
    """Whether the run's job waits for a placement group (bundles besides the driver's), and so reports
    `resources` events; a kind without one (eval, local mode) becomes `running` at its job's first post."""
    bundles = (run.resources or {}).get("bundles") if isinstance(run.resources, dict) else None
    return isinstance(bundles, list) and len(bundles) > 1


def placement_timeout(run: Run) -> float:
    value = (run.config or {}).get("placement_timeout_s") if isinstance(run.config, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return PLACEMENT_TIMEOUT_DEFAULT


def job_status_of(run: Run, jobs: Jobs) -> str | None:
    """Ray's status of the run's current attempt (None: not submitted yet, or Ray does not know it)."""
    if run.ray_submission_id != ray.submission_id_for(run):
        return None
    return jobs.get(run.pk)


def requeue(run: Run, reason: str) -> bool:
    """run_requeue, then stop the old attempt's job (it may still be waiting for its group)."""
    old = run_requeue(run=run, reason=reason)
    if old is None:
        return False
    job_submission_stop(old)
    return True


def runs_starting_check(*, now: datetime, jobs: Jobs) -> dict[str, list[int]]:
    """Apply the `starting` rules to every starting run; returns {"launch_timeout", "requeued", "relaunch"}
    (relaunch: the runs whose launch was lost, for the caller to hand to the launcher again)."""
    done: dict[str, list[int]] = {"launch_timeout": [], "requeued": [], "relaunch": []}
    limit = settings.RUN_LAUNCH_TIMEOUT_SECONDS
    back = reachable_since()
    for run in list(Run.objects.filter(status=RunStatus.STARTING, granted_at__isnull=False)):
        assert run.granted_at is not None
        age = (now - run.granted_at).total_seconds()
        # The launch clock restarts when Ray comes back: time the cluster could not be reached is not the run's.
        launch_age = (now - max(run.granted_at, back)).total_seconds() if back else age
        status = job_status_of(run, jobs)
        try:
            if launch_age > limit:
                job = f"Ray job {run.ray_submission_id} is {status}" if status else "Ray has no job for it"
                error = f"launch timeout: not running {int(age)} s after its grant (limit {limit} s; {job})"
                if back and back > run.granted_at:
                    error += f"; {int(launch_age)} s since Ray was reachable again"
                if _fail(run, error):
                    done["launch_timeout"].append(run.pk)
            elif run.heartbeat_at is None and age > placement_timeout(run) + settings.RUN_PLACEMENT_MARGIN_SECONDS:
                reason = f"placement not ready within {int(placement_timeout(run))} s and the job never reported"
                if requeue(run, reason):
                    done["requeued"].append(run.pk)
            elif status is None and age > RELAUNCH_AFTER_SECONDS:
                done["relaunch"].append(run.pk)
        except Exception:  # noqa: BLE001 - one bad run must not stop the sweep of the others
            logger.exception("run %s: starting check failed", run.pk)
    return done


def _fail(run: Run, error: str) -> bool:
    with transaction.atomic():
        slot_store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status != run.status:
            return False
        run_finish(run=locked, status=RunStatus.FAILED, error=error, stop_job=True)
    return True


def lost_nodes() -> dict[str, str]:
    """{node id: address} of every node the last read of Ray found dead or gone."""
    return dict(ClusterNode.objects.filter(alive=False).values_list("node_id", "address"))


def runs_node_loss() -> dict[int, str]:
    """End the held runs with a bundle on a lost node: running -> failed "node <id> (<address>) lost"
    (auto_resume applies: run_finish), stopping -> cancelled (the user asked for the end already), starting ->
    back to the queue (only its planned placement was there; its group was never ready). Returns {run: what}."""
    lost = lost_nodes()
    if not lost:
        return {}
    hit: dict[int, str] = {}
    for run_id, placement in Slot.objects.filter(state=SlotState.HELD).values_list("run_id", "placement"):
        node = next((n for n in placement or [] if isinstance(n, str) and n in lost), None)
        if node is not None:
            hit[run_id] = f"node {node} ({lost[node] or 'no address'}) lost"
    done: dict[int, str] = {}
    for run_id, reason in hit.items():
        try:
            done[run_id] = _node_lost(run_id, reason)
        except Exception:  # noqa: BLE001
            logger.exception("run %s: node loss not applied", run_id)
    return done


def _node_lost(run_id: int, reason: str) -> str:
    run = Run.objects.get(pk=run_id)
    if run.status == RunStatus.STARTING:
        return "requeued" if requeue(run, f"{reason} before its placement group was ready") else "unchanged"
    with transaction.atomic():
        slot_store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run_id)
        if locked.status == RunStatus.RUNNING:
            run_finish(run=locked, status=RunStatus.FAILED, error=reason, stop_job=True)
            return RunStatus.FAILED
        if locked.status == RunStatus.STOPPING:
            run_finish(run=locked, status=RunStatus.CANCELLED, error=f"{locked.error}; {reason}", stop_job=True)
            return RunStatus.CANCELLED
    return "unchanged"
