"""Liveness without a Ray cluster (docs/execution.md, "Liveness"): the job's `resources` events and heartbeats
through the real ingest request, the starting rules and the stale-heartbeat rules against a given view of Ray's
jobs, node loss against ClusterNode rows, and the cluster reader's writes."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runs import selectors, services
from runs.execution import capacity, liveness
from runs.models import ClusterNode, ClusterStatus, Run, RunEvent, RunStatus, Slot, SlotState
from tests.runs.helpers import TEST_JOB_KIND

pytestmark = pytest.mark.django_db(transaction=True)

GROUP = {"bundles": [{"role": r, "CPU": 0.25, "GPU": 0, "memory": 1} for r in ("driver", "learner", "engine-0")]}


@pytest.fixture(autouse=True)
def _artifacts(settings, tmp_path):
    settings.RUN_ARTIFACTS_DIR = str(tmp_path)
    settings.RAY_ADDRESS = "http://127.0.0.1:9"  # no Ray here (never the machine's default 8265: maybe someone's)


def submit(user, *, group: bool = True, **kw) -> Run:
    run = services.run_submit(owner=user, name="r", origin="api", kind=TEST_JOB_KIND, config={}, **kw)
    if group:  # what admission's submit stores for a run whose job waits for a placement group
        Run.objects.filter(pk=run.pk).update(resources=GROUP)
    run.refresh_from_db()
    return run


def post(run: Run, events, *, token: str | None = None):
    response = Client().post(
        f"/api/runs/{run.pk}/ingest/",
        data=events,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token or run.ingest_token}",
    )
    assert response.status_code == 200, response.content
    return response.json()


def resources(seq: int, state: str, **data) -> dict:
    return {"seq": seq, "ts": time.time(), "type": "resources", "data": {"state": state, "strategy": "PACK", **data}}


def test_a_heartbeat_is_stamped_and_stores_nothing(user, handoffs):
    run = submit(user)
    reply = post(run, {"events": []})
    assert reply == {"stored": 0, "duplicates": 0, "last_seq": 2, "status": "starting", "dropped": 0, "commands": []}
    run.refresh_from_db()
    assert run.heartbeat_at is not None and run.status == RunStatus.STARTING  # waits for its group
    assert RunEvent.objects.filter(run=run).exclude(source="platform").count() == 0


def test_waiting_then_ready_moves_the_run_to_running_with_its_placement(user, handoffs):
    run = submit(user)
    post(run, [resources(1, "waiting", waited_s=0.0, detail="PACK group of 2 bundles pending")])
    run.refresh_from_db()
    assert (run.status, run.pending_reason) == (RunStatus.STARTING, "waiting_for_resources")
    assert run.pending_detail == "PACK group of 2 bundles pending"

    reply = post(run, [resources(2, "ready", waited_s=3.5, nodes=["na", "nb", "nb"])])
    assert reply["status"] == RunStatus.RUNNING
    run.refresh_from_db()
    assert (run.status, run.pending_reason, run.pending_detail) == (RunStatus.RUNNING, "", "")
    assert Slot.objects.get(run=run).placement == ["na", "nb", "nb"]
    # A late `ready` (retried post) changes nothing.
    assert post(run, [resources(3, "ready", nodes=["x"])])["status"] == RunStatus.RUNNING


def test_a_run_that_ends_while_waiting_for_resources_loses_its_pending_reason(user, handoffs):
    run = submit(user)
    post(run, [resources(1, "waiting", waited_s=0.0, detail="PACK group of 2 bundles pending")])
    services.run_finish(run=run, status=RunStatus.FAILED, error="job lost")
    run.refresh_from_db()
    assert (run.status, run.pending_reason, run.pending_detail) == (RunStatus.FAILED, "", "")
    assert selectors.runs_json([run])[0]["pending_reason"] is None


def test_a_run_without_a_placement_group_runs_at_its_first_post(user, handoffs):
    run = submit(user, group=False)
    assert post(run, {"events": []})["status"] == RunStatus.RUNNING


def test_placement_timeout_requeues_at_the_old_position_and_grants_the_next(user, handoffs):
    services.settings_update(changes={"max_total": 1}, partial=True, by=None)
    run, later = submit(user), submit(user)
    slot = Slot.objects.get(run=run)
    requested_at = slot.requested_at
    assert later.status == RunStatus.QUEUED

    reply = post(run, [resources(1, "timeout", waited_s=300.0, detail="2 CPU not available")])
    run.refresh_from_db()
    slot.refresh_from_db()
    # Not a failure: back in line at its old position as a new attempt (a new Ray job id), holding nothing; the
    # grant pass of the same transaction finds it still the head of its class and grants it again, not `later`.
    assert (reply["status"], run.status, run.attempt, run.error) == ("starting", RunStatus.STARTING, 1, "")
    assert "placement group not ready within 300.0 s: 2 CPU not available" in run.pending_detail
    assert (slot.state, slot.requested_at) == (SlotState.HELD, requested_at)
    statuses = [(e.data["status"], e.data["error"]) for e in run.events.filter(type="status").order_by("seq")]
    assert statuses == [("queued", ""), ("starting", ""), ("queued", ""), ("starting", "")]
    later.refresh_from_db()
    assert later.status == RunStatus.QUEUED


def test_requeue_frees_the_slot_for_the_next_run_when_the_requeued_run_is_behind(user, handoffs):
    services.settings_update(changes={"max_total": 1}, partial=True, by=None)
    run, later = submit(user), submit(user)
    Slot.objects.filter(run=later).update(requested_at=Slot.objects.get(run=run).requested_at - timedelta(seconds=1))
    assert post(run, [resources(1, "timeout", waited_s=300.0)])["status"] == RunStatus.QUEUED
    run.refresh_from_db()
    later.refresh_from_db()
    assert (run.status, run.granted_at, Slot.objects.get(run=run).granted_at) == (RunStatus.QUEUED, None, None)
    assert later.status == RunStatus.STARTING  # granted in the requeue's own transaction


def test_the_old_attempts_posts_are_refused_after_a_requeue(user, handoffs):
    run = submit(user)
    old_token = run.ingest_token
    post(run, [resources(1, "timeout", waited_s=300.0)])
    response = Client().post(
        f"/api/runs/{run.pk}/ingest/",
        data=[],
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {old_token}",
    )
    assert response.status_code == 401


def test_starting_rules(user, handoffs, settings):
    settings.RUN_LAUNCH_TIMEOUT_SECONDS = 900
    settings.RUN_PLACEMENT_MARGIN_SECONDS = 60
    services.settings_update(changes={"max_total": 4}, partial=True, by=None)
    pending, silent, posted = submit(user), submit(user), submit(user)
    sid = {r.pk: f"{settings.RAY_SUBMISSION_PREFIX}-{r.pk}-0" for r in (pending, silent, posted)}
    for r in (pending, silent, posted):
        Run.objects.filter(pk=r.pk).update(ray_submission_id=sid[r.pk])
    now = timezone.now()
    Run.objects.filter(pk=posted.pk).update(heartbeat_at=now)
    jobs = {pending.pk: "PENDING", silent.pk: "PENDING", posted.pk: "RUNNING"}
    # Within every limit: alive, whatever the heartbeat says.
    assert liveness.runs_starting_check(now=now + timedelta(seconds=200), jobs=jobs) == {
        "launch_timeout": [],
        "requeued": [],
        "relaunch": [],
    }
    # Past placement timeout + margin: a job that never posted is put back in the queue (not failed); the others wait.
    done = liveness.runs_starting_check(now=now + timedelta(seconds=361), jobs=jobs)
    assert sorted(done["requeued"]) == sorted([pending.pk, silent.pk]) and done["launch_timeout"] == []
    assert sorted(handoffs.stopped) == []  # the old job is stopped by its submission id (Ray: not reachable here)
    # Past the launch timeout: failed, naming the path and what Ray said.
    done = liveness.runs_starting_check(now=now + timedelta(seconds=901), jobs=jobs)
    assert posted.pk in done["launch_timeout"]  # (and the requeued two, granted again at once, are too)
    posted.refresh_from_db()
    assert posted.error.startswith("launch timeout: not running 90")
    assert f"Ray job {sid[posted.pk]} is RUNNING" in posted.error


def test_the_launch_clock_restarts_when_ray_is_reachable_again(user, handoffs, settings, monkeypatch):
    settings.RUN_LAUNCH_TIMEOUT_SECONDS = 900
    services.settings_update(changes={"max_total": 4}, partial=True, by=None)
    run = submit(user)
    Run.objects.filter(pk=run.pk).update(ray_submission_id=f"{settings.RAY_SUBMISSION_PREFIX}-{run.pk}-0")
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())  # it posted: the placement rule is not it
    run.refresh_from_db()
    jobs = {run.pk: "PENDING"}
    granted = run.granted_at
    ClusterStatus.objects.all().delete()
    monkeypatch.setattr(capacity, "nodes_read", lambda address=None: [])
    down = capacity.ClusterUnreachable("Ray at http://x is not reachable: refused")
    # Reachable at the grant, then a 20-minute outage (the tick checks nothing meanwhile), then back.
    assert capacity.cluster_refresh(now=granted) is True
    monkeypatch.setattr(capacity, "nodes_read", lambda address=None: (_ for _ in ()).throw(down))
    assert capacity.cluster_refresh(now=granted + timedelta(seconds=60)) is False
    assert ClusterStatus.objects.get().reachable_since is None
    monkeypatch.setattr(capacity, "nodes_read", lambda address=None: [])
    back = granted + timedelta(seconds=1260)
    assert capacity.cluster_refresh(now=back) is True
    assert ClusterStatus.objects.get().reachable_since == back
    # 1,300 s after the grant but 40 s after Ray came back: it waits.
    assert liveness.runs_starting_check(now=back + timedelta(seconds=40), jobs=jobs)["launch_timeout"] == []
    # A full launch timeout after Ray came back, still not running: failed, saying both ages.
    done = liveness.runs_starting_check(now=back + timedelta(seconds=901), jobs=jobs)
    assert done["launch_timeout"] == [run.pk]
    run.refresh_from_db()
    assert run.error.startswith("launch timeout: not running 216")
    assert "901 s since Ray was reachable again" in run.error


def test_stale_heartbeat_is_confirmed_against_ray(user, handoffs, settings):
    settings.SLOTS_HEARTBEAT_TIMEOUT_SECONDS = 60
    settings.SLOTS_HEARTBEAT_HARD_TIMEOUT_SECONDS = 600
    services.settings_update(changes={"max_total": 4}, partial=True, by=None)
    alive, gone = submit(user), submit(user)
    for r in (alive, gone):
        services.run_transition(run=r, status=RunStatus.RUNNING)
        Run.objects.filter(pk=r.pk).update(ray_submission_id=f"{settings.RAY_SUBMISSION_PREFIX}-{r.pk}-0")
    now = timezone.now()
    jobs = {alive.pk: "RUNNING", gone.pk: None}
    assert services.runs_reclaim_stale(now=now + timedelta(seconds=120), jobs=None) == []  # Ray unreachable
    assert services.runs_reclaim_stale(now=now + timedelta(seconds=120), jobs=jobs) == [gone.pk]
    gone.refresh_from_db()
    assert gone.error.startswith("heartbeat lost and Ray no longer knows job ")
    assert services.runs_reclaim_stale(now=now + timedelta(seconds=599), jobs=jobs) == []
    assert services.runs_reclaim_stale(now=now + timedelta(seconds=602), jobs=jobs) == [alive.pk]
    alive.refresh_from_db()
    assert alive.error.startswith("heartbeat lost for 60") and "while Ray reports the job running" in alive.error
    assert set(handoffs.stopped) == {alive.pk, gone.pk}


def test_node_loss_ends_exactly_the_runs_placed_on_the_node(user, handoffs):
    services.settings_update(changes={"max_total": 4}, partial=True, by=None)
    now = timezone.now()
    ClusterNode.objects.create(node_id="a", address="10.0.0.1", alive=True, total={}, seen_at=now)
    ClusterNode.objects.create(node_id="b", address="10.0.0.2", alive=False, total={}, seen_at=now)
    on_a, on_b, planned_on_b = submit(user), submit(user), submit(user)
    waiting = submit(user)  # three app runs hold slots (the fourth is the interactive reserve): this one waits
    assert waiting.status == RunStatus.QUEUED
    for r in (on_a, on_b):
        services.run_transition(run=r, status=RunStatus.RUNNING)
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
    run = services.run_submit(owner=user, name="r", origin="api", kind=TEST_JOB_KIND, config={})
    Slot.objects.filter(run_id=run.pk).update(state=SlotState.HELD, placement=["live", "held"])
    assert capacity.dead_nodes_prune(now=now) == 1
    assert sorted(ClusterNode.objects.values_list("node_id", flat=True)) == ["held", "live", "recent"]


def test_the_board_snapshot_says_when_ray_is_unreachable(staff):
    from runs.dashboard import dashboard_snapshot

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


def test_reconcile_of_starting_runs_follows_the_placement_rules(user, handoffs):
    from types import SimpleNamespace

    from runs.execution.reconcile import run_reconcile

    services.settings_update(changes={"max_total": 4}, partial=True, by=None)
    grouped, plain, silent = submit(user), submit(user, group=False), submit(user, group=False)
    Run.objects.filter(pk__in=[grouped.pk, plain.pk]).update(heartbeat_at=timezone.now())
    running = SimpleNamespace(status="RUNNING", message="")
    for run in (grouped, plain, silent):
        run.refresh_from_db()
    # A job that runs but whose group is not ready: the run stays `starting` until its `ready` event.
    assert run_reconcile(run=grouped, info=running) == "unchanged"
    # Without a group, a job Ray reports running that has posted is re-attached; one that never posted waits.
    assert run_reconcile(run=plain, info=running) == "reattached"
    assert run_reconcile(run=silent, info=running) == "unchanged"
    # A group job that exited 0 while starting: its `timeout` event was lost; requeued, not succeeded.
    assert run_reconcile(run=grouped, info=SimpleNamespace(status="SUCCEEDED", message="")) == "requeued"
    grouped.refresh_from_db()
    assert grouped.attempt == 1 and grouped.status in (RunStatus.QUEUED, RunStatus.STARTING)
