"""A real two-node Ray cluster on this machine (ray.cluster_utils.Cluster: a head and one worker node, each with
2 logical GPUs; no physical GPU needed): the tick's cluster reader sees both nodes and their GPUs through the
dashboard's HTTP API, and removing the worker node ends exactly the runs placed on it (resuming the auto-resume
one), releases their slots and grants the next waiting run; and admission against those 4 GPUs takes 1-, 2- and
4-GPU runs only when they fit, keeps a 4-GPU head's reservation and refuses what no node can hold.

The node-loss test sets Slot.placement of its held runs itself, so which run is on which node is its choice."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.utils import timezone

from runs.core.lifecycle import run_finish, run_transition
from runs.execution import capacity, liveness
from runs.execution.submit import run_submit
from runs.models import ClusterNode, ClusterStatus, Run, RunStatus, Slot
from runs.scheduling.concurrency import settings_update
from tests.conftest import free_port
from tests.runs.helpers import TEST_JOB_KIND, handoffs, register_test_kind, user  # noqa: F401 - fixtures

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
register_test_kind()


@dataclass
class TwoNodes:
    cluster: Any
    worker: Any
    dashboard_url: str
    head_id: str
    worker_id: str


def _node_args(temp_dir: str, **extra: Any) -> dict[str, Any]:
    return {
        "num_cpus": 1,
        "num_gpus": 2,
        "temp_dir": temp_dir,
        "metrics_export_port": free_port(),
        "object_store_memory": 80 * 1024 * 1024,
        **extra,
    }


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodes]:
    import ray._private.utils
    from ray.cluster_utils import Cluster

    # Cluster writes the head's address to /tmp/ray/ray_current_cluster (what ray.init("auto") reads): another
    # session's business on a shared machine, and this test connects by address.
    saved_write = ray._private.utils.write_ray_address
    ray._private.utils.write_ray_address = lambda *args, **kwargs: None
    temp_dir = tempfile.mkdtemp(prefix="ray-2n-")
    dash_port = free_port()
    cluster = Cluster(
        initialize_head=True,
        shutdown_at_exit=True,
        head_node_args=_node_args(
            temp_dir,
            gcs_server_port=free_port(),
            include_dashboard=True,
            dashboard_host="127.0.0.1",
            dashboard_port=dash_port,
            dashboard_agent_listen_port=free_port(),
            ray_client_server_port=free_port(),
        ),
    )
    try:
        worker = cluster.add_node(**_node_args(temp_dir))
        url = f"http://127.0.0.1:{dash_port}"
        deadline = time.monotonic() + 240  # the dashboard of a loaded 2-core machine is slow to answer
        nodes: list[capacity.NodeSeen] = []
        while time.monotonic() < deadline:
            try:
                nodes = [n for n in capacity.nodes_read(url) if n.alive]
            except capacity.ClusterUnreachable:
                nodes = []
            if len(nodes) == 2:
                break
            time.sleep(1)
        assert len(nodes) == 2, f"the 2-node cluster did not come up: {nodes}"
        yield TwoNodes(
            cluster=cluster,
            worker=worker,
            dashboard_url=url,
            head_id=cluster.head_node.node_id,
            worker_id=worker.node_id,
        )
    finally:
        cluster.shutdown()
        ray._private.utils.write_ray_address = saved_write
        shutil.rmtree(temp_dir, ignore_errors=True)


def submit(user, **kw) -> Run:  # noqa: F811 - `user` is the fixture's value
    return run_submit(owner=user, name="r", origin="api", kind=TEST_JOB_KIND, config={}, **kw)


# Small CPU and memory shares, so the two 1-CPU nodes hold several runs and GPUs decide what fits.
SMALL = {"num_engines": 1, "num_workers": 1, "actor_memory_mb": 64, "steps": 1}
SMALL.update({k: 0.05 for k in ("driver_cpus", "learner_cpus", "engine_cpus", "worker_cpus")})


def gpu_run(user, config: dict, time_limit_seconds: int | None = None) -> Run:  # noqa: F811
    return run_submit(
        owner=user,
        name="gpu",
        origin="api",
        kind="rl_train",
        config={**SMALL, **config},
        time_limit_seconds=time_limit_seconds,
    )


def test_gpu_runs_are_admitted_only_when_they_fit_the_two_nodes(two_nodes, user, handoffs, settings):  # noqa: F811
    """4 logical GPUs on two nodes of 2, read from Ray: 1- and 2-GPU runs fit; 4 GPUs in four 1-GPU bundles wait
    for 4 free GPUs (reserved: a 2-GPU run that would end after it could start does not jump ahead, a short 1-GPU
    run does) and start in the very pass that frees them; a 4-GPU bundle is refused (no node has 4)."""
    from runs.errors import InvalidInput

    settings.RAY_ADDRESS = two_nodes.dashboard_url
    ClusterNode.objects.all().delete()  # capacity comes from this two-node cluster only
    assert capacity.cluster_refresh(now=timezone.now()) is True
    settings_update(changes={"max_total": 20, "interactive_reserve": 0}, partial=True, by=None)

    one = gpu_run(user, {"learner_gpus": 1})
    assert one.status == RunStatus.STARTING
    four = gpu_run(user, {"num_engines": 4, "engine_gpus": 1})  # 4 bundles of 1 GPU: needs both nodes
    assert four.status == RunStatus.QUEUED  # 3 GPUs free
    two = gpu_run(user, {"learner_gpus": 2})  # fits the free GPUs but would end after the head could start
    assert two.status == RunStatus.QUEUED
    short = gpu_run(user, {"learner_gpus": 1}, time_limit_seconds=60)  # ends long before: backfilled
    assert short.status == RunStatus.STARTING
    with pytest.raises(InvalidInput) as refused:
        gpu_run(user, {"learner_gpus": 4})
    assert refused.value.field == "config" and "largest node 2" in str(refused.value)

    run_finish(run=short, status=RunStatus.SUCCEEDED)
    assert Run.objects.get(pk=four.pk).status == RunStatus.QUEUED  # one GPU still held by `one`
    run_finish(run=one, status=RunStatus.SUCCEEDED)  # 4 GPUs free: the head goes first, in this pass
    four.refresh_from_db()
    assert four.status == RunStatus.STARTING
    placement = Slot.objects.get(run=four).placement
    gpu_nodes = [node for node, b in zip(placement, four.resources["bundles"]) if b["GPU"]]
    assert sorted(gpu_nodes) == sorted([two_nodes.head_id] * 2 + [two_nodes.worker_id] * 2)
    assert Run.objects.get(pk=two.pk).status == RunStatus.QUEUED  # no GPU left for it


def test_two_nodes_are_read_and_losing_one_ends_exactly_its_runs(two_nodes, user, handoffs, settings, tmp_path):  # noqa: F811
    settings.RAY_ADDRESS = two_nodes.dashboard_url
    settings.RUN_ARTIFACTS_DIR = str(tmp_path)
    ClusterNode.objects.all().delete()  # capacity comes from this two-node cluster only
    assert capacity.cluster_refresh(now=timezone.now()) is True
    nodes = {row.node_id: row for row in ClusterNode.objects.all()}
    assert set(nodes) == {two_nodes.head_id, two_nodes.worker_id}
    assert all(row.alive and row.total["GPU"] == 2.0 and row.total["CPU"] == 1.0 for row in nodes.values())
    assert ClusterStatus.objects.get().reachable

    # Three app-class runs held (the fourth slot is the interactive reserve), one waiting.
    settings_update(changes={"max_total": 4}, partial=True, by=None)
    on_worker, on_worker_resumed, on_head = submit(user), submit(user, auto_resume=True), submit(user)
    waiting = submit(user)
    assert waiting.status == RunStatus.QUEUED
    head, worker = two_nodes.head_id, two_nodes.worker_id
    placements = {on_worker: [head, worker], on_worker_resumed: [worker, worker], on_head: [head, head]}
    for run, placement in placements.items():
        run_transition(run=run, status=RunStatus.RUNNING)
        Slot.objects.filter(run=run).update(placement=placement)

    two_nodes.cluster.remove_node(two_nodes.worker)
    deadline = time.monotonic() + 120
    while True:
        capacity.cluster_refresh(now=timezone.now())
        if not ClusterNode.objects.get(node_id=worker).alive:
            break
        assert time.monotonic() < deadline, "Ray never reported the removed node dead or gone"
        time.sleep(1)
    assert ClusterNode.objects.get(node_id=head).alive

    done = liveness.runs_node_loss()
    assert done == {on_worker.pk: RunStatus.FAILED, on_worker_resumed.pk: RunStatus.FAILED}
    address = ClusterNode.objects.get(node_id=worker).address
    for run in (on_worker, on_worker_resumed, on_head, waiting):
        run.refresh_from_db()
    assert (on_worker.status, on_worker.error) == (RunStatus.FAILED, f"node {worker} ({address}) lost")
    # Failed with the node named, then resumed as attempt 1 (queued or granted again at once).
    assert on_worker_resumed.status in (RunStatus.QUEUED, RunStatus.STARTING) and on_worker_resumed.attempt == 1
    failed = on_worker_resumed.events.filter(type="status", data__status="failed").get()
    assert failed.data["error"] == f"node {worker} ({address}) lost"
    assert on_head.status == RunStatus.RUNNING  # not on the lost node: untouched
    assert waiting.status == RunStatus.STARTING  # the released slot went to the next waiting run
    assert not Slot.objects.filter(run=on_worker).exists()
    assert {on_worker.pk, on_worker_resumed.pk} <= set(handoffs.stopped)
    assert liveness.runs_node_loss() == {}  # once
