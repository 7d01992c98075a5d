"""Celery task bodies called directly (no broker): dispatch hands a granted run to the one launcher (Ray's
submit replaced by a recorder), stop asks it to stop the job or cancels a run that has none."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from runs import services, tasks
from runs.execution import ray
from runs.models import Run, RunStatus, Slot
from tests.runs.helpers import TEST_JOB_KIND, TEST_KIND

pytestmark = pytest.mark.django_db


@pytest.fixture
def submitted(monkeypatch, tmp_path, settings):
    settings.RUN_ARTIFACTS_DIR = str(tmp_path)
    got: list[int] = []
    monkeypatch.setattr(ray, "job_submit", lambda run, spec: got.append(run.pk) or ray.submission_id_for(run))
    return got


def submit(user, kind=TEST_KIND):
    return services.run_submit(owner=user, name="t", origin="api", kind=kind, config={})


def test_dispatch_launches_starting_runs_only(user, handoffs, submitted):
    run = submit(user, TEST_JOB_KIND)
    assert tasks.dispatch_run(run.pk) == "launched" and submitted == [run.pk]
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.ray_submission_id == ray.submission_id_for(run)
    assert tasks.dispatch_run(run.pk) == "skipped" and submitted == [run.pk]  # a stale message is ignored


def test_dispatch_without_launcher_fails_run_and_frees_slot(user, handoffs):
    run = submit(user)
    assert tasks.dispatch_run(run.pk) == "failed"
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "has no launcher" in run.error
    assert not Slot.objects.filter(run_id=run.pk).exists()


def test_stop_of_a_run_without_a_job_cancels_it(user, handoffs):
    run = submit(user)
    services.run_cancel(run=run, by=user)
    assert tasks.stop_run(run.pk) == "stop requested"
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_tick_logs_only_when_it_did_something(user, handoffs, caplog):
    """One tick runs every 2 s: an idle one logs nothing; one that reclaims a run says so, at INFO."""
    caplog.set_level(logging.DEBUG, logger="runs")
    run = submit(user)
    assert tasks.tick()["reclaimed"] == []
    assert [r.getMessage() for r in caplog.records if r.name == "runs.tasks"] == []

    Run.objects.filter(pk=run.pk).update(granted_at=timezone.now() - timedelta(hours=1))  # never heartbeated
    assert tasks.tick()["reclaimed"] == [run.pk]
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "runs.tasks"]
    assert logged == [(logging.INFO, f"tick: reclaimed [{run.pk}]")]
