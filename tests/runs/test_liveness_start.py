"""Liveness of a starting run without a Ray cluster (docs/execution.md, "Liveness"): the job's `resources`
events and heartbeats through the real ingest request, the starting rules against a given view of Ray's jobs,
and the reconcile of starting runs. Stale heartbeats, node loss and the cluster reader are in
test_liveness_cluster.py."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runs import selectors
from runs.core.lifecycle import run_finish
from runs.execution import capacity, liveness
from runs.models import ClusterNode, ClusterStatus, Run, RunEvent, RunStatus, Slot, SlotState
from runs.scheduling.concurrency import settings_update
from tests.runs.liveness_fixtures import _artifacts, submit  # noqa: F401 - _artifacts: an autouse fixture

pytestmark = pytest.mark.django_db(transaction=True)


def post_raw(run: Run, events, *, token: str | None = None):
    return Client().post(
        f"/api/runs/{run.pk}/ingest/",
        data=events,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token or run.ingest_token}",
    )


def post(run: Run, events, *, token: str | None = None):
    response = post_raw(run, events, token=token)
    assert response.status_code == 200, response.content
    return response.json()


def nodes_known(*node_ids: str) -> None:
    """Nodes the platform knows (the tick writes these from Ray): a job may only report placement on them."""
    for node_id in node_ids:
        ClusterNode.objects.get_or_create(node_id=node_id, defaults={"total": {"CPU": 8}, "seen_at": timezone.now()})


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
    nodes_known("na", "nb", "x")
    post(run, [resources(1, "waiting", waited_s=0.0, detail="PACK group of 2 bundles pending")])
    run.refresh_from_db()
    assert (run.status, run.pending_reason) == (RunStatus.STARTING, "waiting_for_resources")
    assert run.pending_detail == "PACK group of 2 bundles pending"

    # The group is ready: the run is still starting (its processes start), and it is placed where Ray put it.
    detail = "placement group ready after 3.5 s; starting 2 process(es)"
    reply = post(run, [resources(2, "placed", waited_s=3.5, nodes=["na", "nb", "nb"], detail=detail)])
    assert reply["status"] == RunStatus.STARTING
    run.refresh_from_db()
    assert (run.status, run.pending_reason, run.pending_detail) == (RunStatus.STARTING, "starting_processes", detail)
    assert Slot.objects.get(run=run).placement == ["na", "nb", "nb"]

    reply = post(run, [resources(3, "ready", waited_s=3.5, nodes=["na", "nb", "nb"])])
    assert reply["status"] == RunStatus.RUNNING
    run.refresh_from_db()
    assert (run.status, run.pending_reason, run.pending_detail) == (RunStatus.RUNNING, "", "")
    assert Slot.objects.get(run=run).placement == ["na", "nb", "nb"]
    # A late `placed` or `ready` (retried posts) changes nothing: not the status, the reason or the placement.
    assert post(run, [resources(4, "placed", nodes=["x"])])["status"] == RunStatus.RUNNING
    assert post(run, [resources(5, "ready", nodes=["x"])])["status"] == RunStatus.RUNNING
    run.refresh_from_db()
    assert run.pending_reason == "" and Slot.objects.get(run=run).placement == ["na", "nb", "nb"]


def test_a_placed_event_with_hostile_nodes_keeps_the_granted_placement(user, handoffs):
    """`placed` nodes that are not one known node id per bundle are not stored (grants charge bundle i to node
    i). Ids that are not strings of at most 64 characters refuse the post (400 naming the node); unknown ids, and
    known ids of the wrong count, are accepted and ignored: the reason still says what happens."""
    run = submit(user)
    nodes_known("na", "nb", "a", "b")
    granted = Slot.objects.get(run=run).placement
    assert len(run.resources["bundles"]) == 3
    refused = [
        ("node", "events[0].data.nodes"),
        ([1, 2, 3], "events[0].data.nodes[0]"),
        ([{"id": "x"}] * 3, "events[0].data.nodes[0]"),
        (["n" * 65, "a", "b"], "events[0].data.nodes[0]"),
    ]
    for seq, (nodes, field) in enumerate(refused, start=1):
        response = post_raw(run, [resources(seq, "placed", waited_s=0.1, nodes=nodes)])
        assert (response.status_code, response.json()["field"]) == (400, field), response.content
        assert f"event seq {seq}" in response.json()["detail"]
    assert not RunEvent.objects.filter(run=run).exclude(source="platform").exists()  # nothing of them stored
    for seq, nodes in enumerate(
        [None, [], ["na"], ["na", "nb", "nb", "a"], ["na", "nb", "nc"], ["", "a", "b"]], start=1
    ):
        reply = post(run, [resources(seq, "placed", waited_s=0.1, nodes=nodes)])
        assert reply["status"] == RunStatus.STARTING
        run.refresh_from_db()
        assert run.pending_reason == "starting_processes"
        assert run.pending_detail == "placement group ready; starting the run's processes"
        assert Slot.objects.get(run=run).placement == granted


def test_ready_on_a_node_the_platform_does_not_know_runs_with_the_granted_placement(user, handoffs):
    """Ray may place a bundle on a node that joined after the tick's last read: the claim is dropped (the slot
    keeps what was granted, and the stored event has no `nodes`), but the run still starts."""
    run = submit(user)
    nodes_known("na", "nb")
    granted = Slot.objects.get(run=run).placement
    assert post(run, [resources(1, "ready", nodes=["na", "nb", "fresh-node"])])["status"] == RunStatus.RUNNING
    assert Slot.objects.get(run=run).placement == granted
    stored = RunEvent.objects.get(run=run, type="resources")
    assert "nodes" not in stored.data and stored.data["state"] == "ready"


def test_a_run_that_ends_while_waiting_for_resources_loses_its_pending_reason(user, handoffs):
    run = submit(user)
    post(run, [resources(1, "waiting", waited_s=0.0, detail="PACK group of 2 bundles pending")])
    run_finish(run=run, status=RunStatus.FAILED, error="job lost")
    run.refresh_from_db()
    assert (run.status, run.pending_reason, run.pending_detail) == (RunStatus.FAILED, "", "")
    assert selectors.runs_json([run])[0]["pending_reason"] is None


def test_a_run_without_a_placement_group_runs_at_its_first_post(user, handoffs):
    run = submit(user, group=False)
    assert post(run, {"events": []})["status"] == RunStatus.RUNNING


def test_placement_timeout_requeues_at_the_old_position_and_grants_the_next(user, handoffs):
    settings_update(changes={"max_total": 1}, partial=True, by=None)
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
    settings_update(changes={"max_total": 1}, partial=True, by=None)
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
    settings_update(changes={"max_total": 4}, partial=True, by=None)
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
    settings_update(changes={"max_total": 4}, partial=True, by=None)
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


def test_reconcile_of_starting_runs_follows_the_placement_rules(user, handoffs):
    from types import SimpleNamespace

    from runs.execution.reconcile import run_reconcile

    settings_update(changes={"max_total": 4}, partial=True, by=None)
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
