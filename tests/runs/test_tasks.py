"""Celery task bodies called directly (no broker): dispatch hands a granted run to its kind's launcher."""
from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from runs import kinds, services, tasks
from runs.kinds import kind_attach, kind_get
from runs.models import Run, RunStatus, Slot
from tests.runs.helpers import TEST_KIND

pytestmark = pytest.mark.django_db


@pytest.fixture
def launcher():
    launched: list[int] = []
    stopped: list[int] = []
    original = kind_get(TEST_KIND)
    kind_attach(TEST_KIND, launch=lambda run: launched.append(run.pk), stop=lambda run: stopped.append(run.pk))
    yield launched, stopped
    kinds._kinds[TEST_KIND] = original  # the registry is process-wide: put the hook-less kind back


def submit(user):
    return services.run_submit(owner=user, name="t", origin="api", kind=TEST_KIND, config={})


def test_dispatch_launches_starting_runs_only(user, handoffs, launcher):
    launched, _ = launcher
    run = submit(user)
    assert tasks.dispatch_run(run.pk) == "launched" and launched == [run.pk]
    services.run_transition(run=run, status=RunStatus.RUNNING)
    assert tasks.dispatch_run(run.pk) == "skipped" and launched == [run.pk]  # a stale message is ignored


def test_dispatch_without_launcher_fails_run_and_frees_slot(user, handoffs):
    run = submit(user)
    assert tasks.dispatch_run(run.pk) == "failed"
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "has no launcher" in run.error
    assert not Slot.objects.filter(run_id=run.pk).exists()


def test_stop_uses_hook_or_finalizes(user, handoffs, launcher):
    _, stopped = launcher
    run = submit(user)
    services.run_cancel(run=run, by=user)
    assert tasks.stop_run(run.pk) == "stop requested" and stopped == [run.pk]
    kinds._kinds[TEST_KIND] = dataclasses.replace(kind_get(TEST_KIND), stop=None)  # a kind with no stop hook
    assert tasks.stop_run(run.pk) == "cancelled"
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
