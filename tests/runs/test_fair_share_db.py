"""Fair share and the per-class user limit against the database (SQLite and PostgreSQL, whichever DATABASE_URL
names): two owners, real submits, releases and grant passes (runs/slots/store.py, runs/slots/pg_snapshot.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs.core.lifecycle import run_finish
from runs.models import Run, RunStatus
from runs.scheduling import queue
from runs.scheduling.concurrency import settings_update
from runs.slots.usage import usage_forget
from tests.runs.test_admission_db import nodes, submit


@pytest.fixture
def heavy_light(django_user_model):
    return django_user_model.objects.create_user("heavy"), django_user_model.objects.create_user("light")


def status(run: Run) -> str:
    run.refresh_from_db()
    return run.status


@pytest.mark.django_db
def test_an_owner_without_usage_goes_before_a_heavy_one(heavy_light, handoffs):
    heavy, light = heavy_light
    nodes(a=(8, 0))
    app = {"fair_share": True}
    settings_update(changes={"max_total": 1, "interactive_reserve": 0, "classes": {"app": app}}, partial=True, by=None)
    first = submit(heavy, name="first")
    assert first.status == RunStatus.STARTING
    Run.objects.filter(pk=first.pk).update(granted_at=timezone.now() - timedelta(hours=1))  # an hour of use
    second = submit(heavy, name="second")
    third = submit(light, name="third")  # later, but its owner used nothing
    usage_forget()
    run_finish(run=first, status=RunStatus.SUCCEEDED)
    assert status(third) == RunStatus.STARTING and status(second) == RunStatus.QUEUED


@pytest.mark.django_db
def test_fair_share_off_keeps_fifo(heavy_light, handoffs):
    heavy, light = heavy_light
    nodes(a=(8, 0))
    settings_update(changes={"max_total": 1, "interactive_reserve": 0}, partial=True, by=None)
    first = submit(heavy, name="first")
    Run.objects.filter(pk=first.pk).update(granted_at=timezone.now() - timedelta(hours=1))
    second, third = submit(heavy, name="second"), submit(light, name="third")
    usage_forget()
    run_finish(run=first, status=RunStatus.SUCCEEDED)
    assert status(second) == RunStatus.STARTING and status(third) == RunStatus.QUEUED


@pytest.mark.django_db
def test_user_limit_keeps_one_owner_queued_with_its_reason(heavy_light, handoffs):
    heavy, light = heavy_light
    nodes(a=(8, 0))
    app = {"max_running_per_user": 1}
    settings_update(changes={"max_total": 3, "interactive_reserve": 0, "classes": {"app": app}}, partial=True, by=None)
    first, second = submit(heavy, name="first"), submit(heavy, name="second")
    third = submit(light, name="third")
    assert [status(r) for r in (first, second, third)] == [RunStatus.STARTING, RunStatus.QUEUED, RunStatus.STARTING]
    info = queue.runs_queue_info(runs=[second])[second.pk]
    assert info.pending_reason == "user_limit_reached"
    assert info.pending_detail == {"max_running_per_user": 1, "held": 1}
    heavy_dry = queue.slot_dry_run(origin="api", owner=heavy.pk)
    assert heavy_dry["granted"] is False and heavy_dry["pending_reason"] == "user_limit_reached"
    assert queue.slot_dry_run(origin="api", owner=light.pk)["pending_reason"] == "user_limit_reached"
    assert queue.slot_dry_run(origin="api", owner=light.pk + heavy.pk + 1)["granted"] is True
    run_finish(run=first, status=RunStatus.SUCCEEDED)
    assert status(second) == RunStatus.STARTING


@pytest.mark.django_db
def test_usage_reads_stored_totals_and_falls_back_to_bundles(heavy_light, handoffs):
    from runs.slots.resources import Res
    from runs.slots.usage import spans_load

    heavy, light = heavy_light
    nodes(a=(8, 0))
    now = timezone.now()
    a = submit(heavy, name="with-total", cpus=2.0)
    b = submit(light, name="bundles-only", cpus=1.5, bundles=2)
    old = submit(light, name="long-ago", cpus=1.0)
    Run.objects.filter(pk=b.pk).update(resources={"bundles": b.resources["bundles"]})  # no stored total
    Run.objects.filter(pk__in=[a.pk, b.pk]).update(granted_at=now - timedelta(minutes=5))
    Run.objects.filter(pk=old.pk).update(
        granted_at=now - timedelta(days=30), finished_at=now - timedelta(days=29), status=RunStatus.SUCCEEDED
    )
    spans = {owner: res for owner, _start, _end, res in spans_load(now=now, half_life=3600)}
    assert spans[heavy.pk] == Res(cpu=2000, gpu=0, memory=1 << 20)
    assert spans[light.pk] == Res(cpu=3000, gpu=0, memory=2 << 20)  # the bundles' sum; the old run is past the horizon
    assert len(spans_load(now=now, half_life=3600)) == 2
