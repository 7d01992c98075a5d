"""Reads: queue position, pending reasons, ETA, slot snapshot, dry-run, and the event recorder."""

from __future__ import annotations

import pytest

from runs import selectors
from runs.core.events import run_events_record
from runs.core.lifecycle import run_finish
from runs.models import RunEvent, RunStatus
from runs.scheduling import queue
from runs.scheduling.concurrency import settings_update
from tests.runs.test_services import submit

pytestmark = pytest.mark.django_db


def test_queue_positions_and_reasons(user, handoffs):
    settings_update(changes={"max_total": 2}, partial=True, by=None)  # reserve 1, others 1
    app_running = submit(user, origin="api")
    sys_a, sys_b = submit(user, origin="system"), submit(user, origin="system")
    app_waiting = submit(user, origin="api")
    interactive = submit(user, origin="dashboard")
    assert app_running.status == "starting" and interactive.status == "starting"
    info = queue.runs_queue_info(runs=[sys_a, sys_b, app_waiting])
    # grant order: app (30) before system (10), FIFO inside system
    assert (info[app_waiting.pk].position_in_class, info[app_waiting.pk].position_overall) == (1, 1)
    assert (info[sys_a.pk].position_in_class, info[sys_a.pk].position_overall) == (1, 2)
    assert (info[sys_b.pk].position_in_class, info[sys_b.pk].position_overall) == (2, 3)
    assert info[app_waiting.pk].pending_reason == "class_limit_reached"  # app limit = 2 - 1 = 1
    assert info[sys_a.pk].pending_reason == "global_limit_reached"  # both slots held: not the reserve's doing
    assert info[sys_a.pk].eta_seconds is not None and info[sys_a.pk].eta_seconds > 0
    assert queue.runs_queue_info(runs=[app_running]) == {}


def test_global_limit_reason(user, handoffs):
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    submit(user, origin="dashboard")
    waiting = submit(user, origin="dashboard")
    assert queue.runs_queue_info(runs=[waiting])[waiting.pk].pending_reason == "class_limit_reached"
    settings_update(changes={"classes": {"interactive": {"limit": 5}}}, partial=True, by=None)
    assert queue.runs_queue_info(runs=[waiting])[waiting.pk].pending_reason == "global_limit_reached"


def test_snapshot_shape(user, handoffs):
    submit(user, origin="api")
    snap = selectors.slots_snapshot()
    assert snap["policy"] == {
        "max_total": 4,
        "interactive_reserve": 1,
        "classes": {
            "interactive": {"limit": 4, "priority": 40, "gpu_limit": None},
            "app": {"limit": 3, "priority": 30, "gpu_limit": None},
            "schedule": {"limit": 3, "priority": 20, "gpu_limit": None},
            "system": {"limit": 3, "priority": 10, "gpu_limit": None},
        },
    }
    assert snap["borrowable"] == 3
    assert snap["classes"]["app"] == {
        "running": 1,
        "waiting": 0,
        "limit": 3,
        "priority": 30,
        "gpu_limit": None,
        "gpus": 0.0,
    }
    assert snap["total"] == {"running": 1, "max_total": 4}


def test_dry_run(user, handoffs):
    settings_update(changes={"max_total": 2}, partial=True, by=None)
    assert queue.slot_dry_run(origin="system")["granted"] is True
    submit(user, origin="system")
    assert queue.slot_dry_run(origin="api") == {
        "origin": "api",
        "run_class": "app",
        "granted": False,
        "pending_reason": "reserve_protected",
        "pending_detail": None,
        "would_preempt": [],
    }
    assert queue.slot_dry_run(origin="dashboard")["granted"] is True


def test_events_record_is_idempotent_and_gapless(user, handoffs):
    run = submit(user)
    base = run.last_seq
    batch = [{"type": "log", "data": {"i": i}, "source_seq": i, "ts": 1_700_000_000 + i} for i in (1, 2, 2, 3)]
    stored = run_events_record(run=run, source="attempt-1", events=batch)
    assert [e.seq for e in stored] == [base + 1, base + 2, base + 3]
    assert run_events_record(run=run, source="attempt-1", events=batch) == []
    again = run_events_record(run=run, source="attempt-2", events=batch[:1])
    assert [e.seq for e in again] == [base + 4]
    seqs = list(RunEvent.objects.filter(run=run).values_list("seq", flat=True))
    assert seqs == list(range(1, base + 5))
    run_finish(run=run, status=RunStatus.SUCCEEDED)
    last = RunEvent.objects.filter(run=run).last()
    assert last.seq == base + 5 and last.data == {"status": "succeeded", "previous": "starting", "error": ""}


def test_positions_by_scan_match_counts(user, handoffs):
    from runs.scheduling.queue import _positions_by_count, _positions_by_scan
    from runs.slots import store

    settings_update(changes={"max_total": 1, "classes": {"app": {"priority": 10}}}, partial=True, by=None)
    runs = [
        submit(user, origin=o)
        for o in ["system", "api", "schedule", "system", "dashboard", "api", "schedule", "dashboard", "system", "api"]
    ]
    queued = [r for r in runs if r.status == RunStatus.QUEUED]
    policy = store.policy_load(fresh=True)
    assert _positions_by_scan(policy, queued) == _positions_by_count(policy, queued)
    assert sorted(p[1] for p in _positions_by_scan(policy, queued).values()) == list(range(1, len(queued) + 1))
