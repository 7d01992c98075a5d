"""The outbox's acceptance: a process killed right after a lifecycle commit loses none of that commit's effects.

The kill is simulated exactly where it hurts: the commit happens, and the drain that follows it in the same
process (runs/outbox/store.py, its after-commit callback) dies before it does anything. Then another process's
tick (runs.tasks.tick, its view of Ray stubbed) finds the effect and does it, once.

- The web process finishes a training run (a job's final event: runs.core.lifecycle.run_finish, committed on its
  own) and dies: the evaluation run is submitted by the next tick, and a second tick submits no other.
- A worker grants a run (its transaction commits) and dies before launching it: the next tick hands the launch
  to Celery (here a worker that runs it at once), Ray gets one job, and neither a second tick nor a
  redelivered launch message submits another.
"""

from __future__ import annotations

import pytest

from runs import tasks
from runs.core.lifecycle import run_finish, run_transition
from runs.execution import ray
from runs.execution.kinds import DEFAULT_KIND, EVAL_KIND
from runs.execution.submit import run_submit
from runs.models import Run, RunStatus
from runs.outbox import store as outbox_store
from runs.outbox.models import Effect, EffectState
from tests.runs.helpers import TEST_JOB_KIND
from tests.runs.test_tasks import ray_view  # noqa: F401 - a fixture: the tick's view of Ray

pytestmark = pytest.mark.django_db(transaction=True)


class Killed(BaseException):
    """The process is gone (SIGKILL): nothing after this point runs in it."""


def killed_after_commit(keys: list[str]) -> None:
    raise Killed


class FakeRay:
    """Ray's job API as the launcher uses it: one job per submission id; a second submit of it is refused the
    way Ray refuses it ("already exists")."""

    def __init__(self) -> None:
        self.jobs: list[str] = []
        self.submits = 0

    def submit_job(self, *, submission_id: str, **_: object) -> str:
        self.submits += 1
        if submission_id in self.jobs:
            raise RuntimeError(f"Job with submission_id {submission_id} already exists")
        self.jobs.append(submission_id)
        return submission_id


def test_a_finish_whose_process_dies_after_its_commit_gets_its_evaluation_within_one_tick(
    user,
    handoffs,
    ray_view,
    monkeypatch,  # noqa: F811
):
    run = run_submit(owner=user, name="train", origin="api", kind=DEFAULT_KIND, config={"steps": 2})
    run_transition(run=run, status=RunStatus.RUNNING)
    with monkeypatch.context() as dying:
        dying.setattr(outbox_store, "_kicked", killed_after_commit)
        with pytest.raises(Killed):
            run_finish(run=Run.objects.get(pk=run.pk), status=RunStatus.SUCCEEDED)
    assert Run.objects.get(pk=run.pk).status == RunStatus.SUCCEEDED  # committed before the process died
    assert not Run.objects.filter(parent=run).exists()
    followups = Effect.objects.get(kind="followups", payload__run=run.pk)
    assert followups.state == EffectState.PENDING

    done = tasks.tick()
    assert followups.key in done["effects"]
    evals = list(Run.objects.filter(parent=run, kind=EVAL_KIND))
    assert len(evals) == 1 and evals[0].origin == "system"
    assert Effect.objects.get(pk=followups.pk).outcome == "evaluation submitted"
    assert evals[0].pk in handoffs.dispatched  # the evaluation's own launch, drained after its commit

    assert tasks.tick()["effects"] == []
    assert Run.objects.filter(parent=run).count() == 1


def test_a_grant_whose_process_dies_before_the_launch_is_launched_once(
    user,
    handoffs,
    ray_view,
    monkeypatch,
    settings,
    tmp_path,  # noqa: F811
):
    settings.RUN_ARTIFACTS_DIR = str(tmp_path)
    cluster = FakeRay()
    monkeypatch.setattr(ray, "ray_client", lambda: cluster)
    # Celery: a worker that runs each launch it is handed, at once.
    monkeypatch.setattr(tasks.dispatch_run, "delay", lambda run_id: tasks.dispatch_run(run_id))
    with monkeypatch.context() as dying:
        dying.setattr(outbox_store, "_kicked", killed_after_commit)
        with pytest.raises(Killed):
            run_submit(owner=user, name="r", origin="api", kind=TEST_JOB_KIND, config={})
    run = Run.objects.get(name="r")
    assert run.status == RunStatus.STARTING and cluster.jobs == []  # granted, committed, never launched
    launch = Effect.objects.get(kind="dispatch", payload__run=run.pk)
    assert launch.state == EffectState.PENDING

    assert tasks.tick()["effects"] == [launch.key]
    run.refresh_from_db()
    assert cluster.jobs == [ray.submission_id_for(run)] and run.ray_submission_id == cluster.jobs[0]
    assert Effect.objects.get(pk=launch.pk).state == EffectState.DONE

    assert tasks.tick()["effects"] == [] and cluster.submits == 1  # nothing left to launch
    assert tasks.dispatch_run(run.pk) == "launched"  # a launch message delivered twice (Celery's redelivery)
    assert cluster.jobs == [run.ray_submission_id] and cluster.submits == 2  # Ray keeps the one job
