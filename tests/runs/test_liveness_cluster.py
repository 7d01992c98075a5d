"""Liveness of running runs and the cluster without a Ray cluster (docs/execution.md, "Liveness"): the
stale-heartbeat rules against a given view of Ray's jobs, node loss against ClusterNode rows, and the cluster
reader's writes (nodes kept while Ray is unreachable, dead nodes forgotten, the board's snapshot). A starting
run's events and rules are in test_liveness_start.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs.core.lifecycle import run_transition
from runs.execution import capacity, liveness
from runs.execution.submit import run_submit
from runs.execution.sweeps import runs_reclaim_stale
from runs.models import ClusterNode, ClusterStatus, Run, RunStatus, Slot, SlotState
from runs.scheduling.concurrency import settings_update
from tests.runs.helpers import TEST_JOB_KIND
from tests.runs.liveness_fixtures import _artifacts, submit  # noqa: F401 - _artifacts: an autouse fixture

pytestmark = pytest.mark.django_db(transaction=True)


def test_stale_heartbeat_is_confirmed_against_ray(user, handoffs, settings):
    settings.SLOTS_HEARTBEAT_TIMEOUT_SECONDS = 60
    settings.SLOTS_HEARTBEAT_HARD_TIMEOUT_SECONDS = 600
    settings_update(changes={"max_total": 4}, partial=True, by=None)
    alive, gone = submit(user), submit(user)
    for r in (alive, gone):
        run_transition(run=r, status=RunStatus.RUNNING)
        Run.objects.filter(pk=r.pk).update(ray_submission_id=f"{settings.RAY_SUBMISSION_PREFIX}-{r.pk}-0")
    now = timezone.now()
    jobs = {alive.pk: "RUNNING", gone.pk: None}
    assert runs_reclaim_stale(now=now + timedelta(seconds=120), jobs=None) == []  # Ray unreachable
    assert runs_reclaim_stale(now=now + timedelta(seconds=120), jobs=jobs) == [gone.pk]
    gone.refresh_from_db()
    assert gone.error.startswith("heartbeat lost and Ray no longer knows job ")
    assert runs_reclaim_stale(now=now + timedelta(seconds=599), jobs=jobs) == []
    assert runs_reclaim_stale(now=now + timedelta(seconds=602), jobs=jobs) == [alive.pk]
    alive.refresh_from_db()
    assert alive.error.startswith("heartbeat lost for 60") and "while Ray reports the job running" in alive.error
    assert set(handoffs.stopped) == {alive.pk, gone.pk}


def test_node_loss_ends_exactly_the_runs_placed_on_the_node(user, handoffs):
    settings_update(changes={"max_total": 4}, partial=True, by=None)
    now = timezone.now()
    ClusterNode.objects.create(node_id="a", address="10.0.0.1", alive=True, total={}, seen_at=now)
    ClusterNode.objects.create(node_id="b", address="10.0.0.2", alive=False, total={}, seen_at=now)
    on_a, on_b, planned_on_b = submit(user), submit(user), submit(user)
    waiting = submit(user)  # three app runs hold slots (the fourth is the interactive reserve): this one waits
    assert waiting.status == RunStatus.QUEUED
    for r in (on_a, on_b):
        run_transition(run=r, status=RunStatus.RUNNING)
    Slot.objects.filter(run=on_a).update(placement=["a", "a"])
    Slot.objects.filter(run=on_b).update(placement=["a", "b"])
    Slot.objects.filter(run=planned_on_b).update(placement=["b"])

    assert liveness.runs_node_loss() == {on_b.pk: RunStatus.FAILED, planned_on_b.pk: "requeued"}
    on_a.refresh_from_db()
    on_b.refresh_from_db()
    assert on_a.status == RunStatus.RUNNING
    assert (on_b.status, on_b.error) == (RunStatus.FAILED, "node b (10.0.0.2) lost")
    assert not Slot.objects.filter(run=on_b).exists() and on_b.pk in handoffs.stopped
    planned_on_b.refresh_from_db()
    assert planned_on_b.attempt == 1 and "node b (10.0.0.2) lost" in planned_on_b.pending_detail
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.STARTING  # granted the slot the lost run released
    assert liveness.runs_node_loss() == {}  # applied once


def test_the_cluster_reader_keeps_nodes_when_ray_is_unreachable(monkeypatch):
    ClusterNode.objects.all().delete()  # this test is about the rows the reader writes, not the fixture's node
    now = timezone.now()
    seen = [
        capacity.NodeSeen("h", "10.0.0.1", True, {"CPU": 4.0, "GPU": 2.0, "memory": 1e9}),
        capacity.NodeSeen("w", "10.0.0.2", True, {"CPU": 4.0, "GPU": 2.0, "memory": 1e9}),
    ]
    monkeypatch.setattr(capacity, "nodes_read", lambda address=None: seen)
    assert capacity.cluster_refresh(now=now) is True
    assert dict(ClusterNode.objects.values_list("node_id", "alive")) == {"h": True, "w": True}

    def down(address=None):
        raise capacity.ClusterUnreachable("Ray at http://x is not reachable: refused")

    monkeypatch.setattr(capacity, "nodes_read", down)
    assert capacity.cluster_refresh(now=now) is False
    status = ClusterStatus.objects.get()
    assert (status.reachable, status.message) == (False, "Ray at http://x is not reachable: refused")
    assert dict(ClusterNode.objects.values_list("node_id", "alive")) == {"h": True, "w": True}  # left as they were

    seen[1:] = []  # Ray no longer lists w: gone
    monkeypatch.setattr(capacity, "nodes_read", lambda address=None: seen)
    assert capacity.cluster_refresh(now=now) is True
    assert dict(ClusterNode.objects.values_list("node_id", "alive")) == {"h": True, "w": False}
    assert ClusterStatus.objects.get().reachable is True


def test_dead_nodes_are_forgotten_after_the_retention_unless_a_held_slot_is_placed_on_one(user, handoffs, settings):
    ClusterNode.objects.all().delete()
    settings.CLUSTER_DEAD_NODE_RETENTION_SECONDS = 3600
    now = timezone.now()
    total = {"CPU": 8.0, "GPU": 0.0, "memory": 1e10}
    for node_id, alive, age in [("live", True, 0), ("recent", False, 60), ("old", False, 7200), ("held", False, 7200)]:
        ClusterNode.objects.create(
            node_id=node_id, address="", alive=alive, total=total, seen_at=now - timedelta(seconds=age)
        )
    run = run_submit(owner=user, name="r", origin="api", kind=TEST_JOB_KIND, config={})
    Slot.objects.filter(run_id=run.pk).update(state=SlotState.HELD, placement=["live", "held"])
    assert capacity.dead_nodes_prune(now=now) == 1
    assert sorted(ClusterNode.objects.values_list("node_id", flat=True)) == ["held", "live", "recent"]


def test_the_board_snapshot_says_when_ray_is_unreachable(staff):
    from runs.telemetry.dashboard import dashboard_snapshot

    ClusterStatus.objects.create(reachable=False, checked_at=timezone.now(), message="refused")
    ClusterNode.objects.all().delete()  # the snapshot of exactly this node, not the fixture's
    ClusterNode.objects.create(node_id="h", alive=True, total={"CPU": 4, "GPU": 2, "memory": 8}, seen_at=timezone.now())
    cluster = dashboard_snapshot(user=staff)[0]["cluster"]
    assert cluster == {
        "reachable": False,
        "nodes": 1,
        "total": {"CPU": 4.0, "GPU": 2.0, "memory": 8.0},
        "free": {"CPU": 4.0, "GPU": 2.0, "memory": 8.0},
    }
