"""Admission against the database: the demand stored at submit, grants charged against ClusterNode capacity
(placement stored), the submit-time refusal, `insufficient_resources` with its detail, the dry-run with a
config. PostgreSQL only (tests/runs/test_slots_pg_snapshot.py, test_slots_pg_lock.py): the SQL snapshot equal to the
ORM one with resources, and two concurrent grants that cannot both take the last CPU."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from runs import selectors
from runs.core.lifecycle import run_finish, slots_grant
from runs.errors import InvalidInput
from runs.execution.kinds import KINDS, RunKind
from runs.execution.submit import run_submit
from runs.models import ClusterNode, Run, RunStatus, Slot
from runs.scheduling import queue
from runs.scheduling.concurrency import settings_update
from runs.scheduling.enqueue import run_resume
from tests.runs.helpers import TEST_KIND

RES_KIND = "test_resources"


def _demand(config: dict[str, Any]) -> dict[str, Any]:
    bundle = {"CPU": config.get("cpus", 1.0), "GPU": config.get("gpus", 0.0), "memory": 1 << 20}
    bundles = [{"role": f"b-{i}", **bundle} for i in range(config.get("bundles", 1))]
    n = len(bundles)
    return {
        "bundles": bundles,
        "total": {"CPU": bundle["CPU"] * n, "GPU": bundle["GPU"] * n, "memory": n << 20},
        "strategy": config.get("strategy", "PACK"),
    }


KINDS[RES_KIND] = RunKind(
    name=RES_KIND, validate_config=lambda c: c, json_schema=lambda: {}, description="demand from config", demand=_demand
)


def nodes(**totals: tuple[float, float]) -> None:
    """Replace the cluster: node id -> (CPU, GPU)."""
    ClusterNode.objects.all().delete()
    for node_id, (cpu, gpu) in totals.items():
        ClusterNode.objects.create(
            node_id=node_id, alive=True, total={"CPU": cpu, "GPU": gpu, "memory": 1 << 34}, seen_at=timezone.now()
        )


def submit(owner, name="r", origin="api", time_limit_seconds=None, **config: Any) -> Run:
    return run_submit(
        owner=owner, name=name, origin=origin, kind=RES_KIND, config=config, time_limit_seconds=time_limit_seconds
    )


@pytest.mark.django_db
def test_demand_is_stored_and_the_grant_places_it(user, handoffs):
    nodes(a=(2, 2), b=(2, 2))
    run = submit(user, gpus=1, bundles=3)
    assert run.status == RunStatus.STARTING and run.resources["total"]["GPU"] == 3
    slot = Slot.objects.get(run=run)
    assert [b["GPU"] for b in slot.demand] == [1, 1, 1] and slot.placement == ["a", "a", "b"]
    assert slot.time_limit_seconds == run.time_limit_seconds and slot.strategy == "PACK"
    second = submit(user, name="s", gpus=2)
    assert second.status == RunStatus.QUEUED  # one GPU is left free
    info = queue.runs_queue_info(runs=[second])[second.pk]
    assert info.pending_reason == "insufficient_resources"
    assert info.pending_detail["needs"]["GPU"] == 2 and info.pending_detail["free"]["GPU"] == 1
    run_finish(run=run, status=RunStatus.SUCCEEDED)
    second.refresh_from_db()
    assert second.status == RunStatus.STARTING and Slot.objects.get(run=second).placement == ["a"]


@pytest.mark.django_db
def test_a_run_that_can_never_fit_is_refused_at_submit(user, handoffs):
    nodes(a=(8, 2), b=(8, 2))
    with pytest.raises(InvalidInput) as refused:
        submit(user, gpus=4)
    assert refused.value.field == "config"
    assert "needs 4 GPU in one bundle; the cluster has 4 GPU (largest node 2)" in str(refused.value)
    assert submit(user, name="ok", gpus=1, bundles=4).status == RunStatus.STARTING  # 4 GPUs across both nodes


@pytest.mark.django_db
def test_unknown_capacity_accepts_and_waits(user, handoffs):
    ClusterNode.objects.all().delete()
    run = submit(user, gpus=64)
    assert run.status == RunStatus.QUEUED
    info = queue.runs_queue_info(runs=[run])[run.pk]
    assert info.pending_reason == "insufficient_resources"
    assert info.pending_detail["message"] == "cluster capacity not known yet" and info.eta_seconds is None


@pytest.mark.django_db
def test_dry_run_with_a_demand(user, handoffs):
    nodes(a=(1, 0))
    assert queue.slot_dry_run(origin="api", resources=_demand({"cpus": 1}))["granted"] is True
    submit(user, cpus=1)
    dry = queue.slot_dry_run(origin="api", resources=_demand({"cpus": 0.5}), time_limit_seconds=60)
    assert dry["granted"] is False and dry["pending_reason"] == "insufficient_resources"
    assert dry["pending_detail"]["needs"]["CPU"] == 0.5 and dry["pending_detail"]["free"]["CPU"] == 0
    assert queue.slot_dry_run(origin="api")["granted"] is True  # no demand given: needs nothing


@pytest.mark.django_db
def test_resume_keeps_the_demand(user, handoffs):
    nodes(a=(1, 0))
    run = submit(user, cpus=1)
    run_finish(run=run, status=RunStatus.FAILED, error="x")
    resumed = run_resume(run=run, by=user, from_scratch=True)  # no checkpoint: started over
    assert resumed.status == RunStatus.STARTING
    slot = Slot.objects.get(run=run)
    assert slot.demand[0]["CPU"] == 1 and slot.placement == ["a"]


@pytest.mark.django_db
def test_gpu_limit_holds_back_a_class(user, handoffs):
    nodes(a=(8, 4))
    settings_update(changes={"classes": {"app": {"gpu_limit": 1}}}, partial=True, by=None)
    first, second = submit(user, gpus=1), submit(user, name="s", gpus=1)
    assert (first.status, second.status) == (RunStatus.STARTING, RunStatus.QUEUED)
    assert queue.runs_queue_info(runs=[second])[second.pk].pending_reason == "gpu_limit_reached"
    assert selectors.slots_snapshot()["classes"]["app"]["gpus"] == 1.0
    assert submit(user, name="i", origin="dashboard", gpus=1).status == RunStatus.STARTING


@pytest.mark.django_db
def test_starting_run_json_carries_its_pending_reason(user, handoffs):
    run = submit(user)
    Run.objects.filter(pk=run.pk).update(pending_reason="waiting_for_resources", pending_detail="waited 3 s")
    body = selectors.runs_json([Run.objects.get(pk=run.pk)])[0]
    assert body["pending_reason"] == "waiting_for_resources"
    assert body["pending_detail"] == {"message": "waited 3 s"} and body["resources"]["strategy"] == "PACK"


@pytest.mark.django_db
def test_plain_kind_without_demand_still_needs_a_known_cluster(user, handoffs):
    ClusterNode.objects.all().delete()
    run = run_submit(owner=user, name="p", origin="api", kind=TEST_KIND, config={})
    assert run.status == RunStatus.QUEUED
    nodes(a=(1, 0))
    assert slots_grant() == [run.pk]
