"""Celery task bodies called directly (no broker): dispatch hands a granted run to the one launcher (Ray's
submit replaced by a recorder), stop asks it to stop the job or cancels a run that has none."""

from __future__ import annotations

import logging
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db.models import F
from django.utils import timezone

from runs import tasks
from runs.core import lifecycle
from runs.core.cancel import run_cancel
from runs.core.lifecycle import run_transition
from runs.execution import capacity, ray, reconcile
from runs.execution.submit import run_submit
from runs.models import Run, RunStatus, Slot
from runs.outbox.effects import StopJob, effect_load
from runs.scheduling.concurrency import settings_update
from tests.runs.helpers import TEST_JOB_KIND, TEST_KIND

pytestmark = pytest.mark.django_db


@pytest.fixture
def submitted(monkeypatch, tmp_path, settings):
    settings.RUN_ARTIFACTS_DIR = str(tmp_path)
    got: list[int] = []
    monkeypatch.setattr(ray, "job_submit", lambda run, spec: got.append(run.pk) or ray.submission_id_for(run))
    return got


def submit(user, kind=TEST_KIND):
    return run_submit(owner=user, name="t", origin="api", kind=kind, config={})


def test_dispatch_launches_starting_runs_only(user, handoffs, submitted):
    run = submit(user, TEST_JOB_KIND)
    assert tasks.dispatch_run(run.pk) == "launched" and submitted == [run.pk]
    run.refresh_from_db()
    # Submitted, still `starting`: it runs when its job reports (its placement group ready, or its first post).
    assert run.status == RunStatus.STARTING and run.ray_submission_id == ray.submission_id_for(run)
    run_transition(run=run, status=RunStatus.RUNNING)
    assert tasks.dispatch_run(run.pk) == "skipped" and submitted == [run.pk]  # a stale message is ignored


def test_dispatch_without_launcher_fails_run_and_frees_slot(user, handoffs):
    run = submit(user)
    assert tasks.dispatch_run(run.pk) == "failed"
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "has no launcher" in run.error
    assert not Slot.objects.filter(run_id=run.pk).exists()


def test_stop_of_a_run_without_a_job_cancels_it(user, handoffs):
    run = submit(user)
    run_cancel(run=run, by=user)
    assert tasks.stop_run(run.pk) == "stop requested"
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_a_platform_ended_attempts_stop_reaches_its_job_after_a_resume(user, handoffs, monkeypatch):
    """The platform fails a run and its follow-ups resume it before the stop is done: the stop still ends the old
    attempt's job, named in the effect, and leaves the new attempt's alone."""
    stopped: list[str] = []
    monkeypatch.setattr(ray, "ray_client", lambda: SimpleNamespace(stop_job=stopped.append))
    run = submit(user)
    Run.objects.filter(pk=run.pk).update(ray_submission_id="attempt-1-job")
    run.refresh_from_db()
    effects = lifecycle.finish_effects(run, RunStatus.FAILED, timezone.now(), stop_job=True)
    [stop] = [e for e in effects if isinstance(e, StopJob)]
    assert stop.job == "attempt-1-job" and effect_load(stop.kind, stop.payload()) == stop
    Run.objects.filter(pk=run.pk).update(attempt=F("attempt") + 1, ray_submission_id="attempt-2-job")  # resumed
    assert tasks.stop_run(*stop.args()) == "old job stop requested"
    assert stopped == ["attempt-1-job"]


@pytest.fixture
def ray_view(monkeypatch):
    """The tick's view of Ray, set by the test: reachable or not, and the jobs Ray knows (none)."""
    view = {"reachable": True}
    monkeypatch.setattr(capacity, "cluster_refresh", lambda now: view["reachable"])
    monkeypatch.setattr(reconcile, "jobs_observe", lambda runs: {})
    return view


def test_tick_logs_only_when_it_did_something(user, handoffs, caplog, ray_view, django_capture_on_commit_callbacks):
    """One tick runs every 2 s: an idle one logs nothing; one that fails a run says so, at INFO."""
    caplog.set_level(logging.DEBUG, logger="runs")
    with django_capture_on_commit_callbacks(execute=True):  # committed: its launch is drained at once, not by a tick
        run = submit(user)
    assert tasks.tick()["launch_timeout"] == []
    assert [r.getMessage() for r in caplog.records if r.name == "runs.tasks"] == []

    Run.objects.filter(pk=run.pk).update(granted_at=timezone.now() - timedelta(hours=1))  # never got running
    assert tasks.tick()["launch_timeout"] == [run.pk]
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "runs.tasks"]
    assert logged == [(logging.INFO, f"tick: launch_timeout [{run.pk}]")]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.error.startswith("launch timeout: not running 3600 s")


def test_while_ray_is_unreachable_the_tick_fails_nothing_but_time_limits(user, handoffs, ray_view, settings):
    settings.SLOTS_HEARTBEAT_TIMEOUT_SECONDS = 30
    settings_update(changes={"max_total": 4}, partial=True, by=None)
    ray_view["reachable"] = False
    starting, running, limited = submit(user), submit(user), submit(user)
    run_transition(run=running, status=RunStatus.RUNNING)
    hour_ago = timezone.now() - timedelta(hours=1)
    Run.objects.filter(pk__in=[starting.pk, running.pk]).update(granted_at=hour_ago, heartbeat_at=hour_ago)
    Run.objects.filter(pk=limited.pk).update(granted_at=hour_ago, time_limit_seconds=60)
    done = tasks.tick()
    assert done["unreachable"] == ["ray"] and done["timed_out"] == [limited.pk]
    assert "reclaimed" not in done and "launch_timeout" not in done and "node_loss" not in done
    statuses = dict(Run.objects.values_list("pk", "status"))
    assert (statuses[starting.pk], statuses[running.pk]) == (RunStatus.STARTING, RunStatus.RUNNING)

    ray_view["reachable"] = True  # back: the same runs are judged now (Ray knows neither job)
    done = tasks.tick()
    assert (done["launch_timeout"], done["reclaimed"]) == ([starting.pk], [running.pk])
