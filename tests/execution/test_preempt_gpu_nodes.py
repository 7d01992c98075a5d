"""Lossless preemption on a simulated 2-node cluster with 4 logical GPUs (issue 26 item 1, the GPU variant of
tests/execution/test_preempt_live.py): two Ray nodes on this machine (`ray start --num-gpus 2` each, no CUDA), the
platform's daphne and Celery worker (tick every second) on the test PostgreSQL and Redis. Two preemptible
`schedule` runs of 2 GPUs each fill the cluster (one per node: GPUs, not slot counts, are what is full), then an
interactive 2-GPU run is submitted: it fits only once exactly one victim has freed its node. The victim checkpoints
within the grace period, the interactive run is running within grace + 30 s on the victim's node, the victim waits
at position 1 of its class, and it resumes at its checkpoint step + 1 and trains on exactly the sampler groups of
the other `schedule` run, which has the same config and seed and is never preempted: the control run. (Compared
over every step up to a few past the resume; then both are cancelled: their tails would add a minute and show
nothing tests/execution/test_preempt_live.py does not.)

Without CUDA a run holds its logical GPUs in Ray and trains on the CPU: `device: auto` picks CUDA only when the
process was given a GPU and torch sees one (trainer/learner.py `pick_device`), which each run's `worker` event
shows (`device: cpu`, `num_gpus: 2`). The runs are 'local' mode, one process whose driver bundle holds the 2 GPUs
(the job's entrypoint resources: Ray places it on a node with 2 free GPUs), and the agent task's tool latency paces
their steps with sleeps rather than CPU, so the test stays short on a shared 2-core machine."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.utils.dateparse import parse_datetime

from runs.execution import capacity
from runs.models import Preemption
from tests.conftest import REPO_ROOT, VENV_BIN, RayCluster, free_port, head_command, port_clashed
from tests.execution.conftest import (
    TINY_TRAIN_CONFIG,
    consumed,
    ray_jobs_of_run,
    resumed_exactly,
    wait_for,
    wait_jobs_accepted,
)
from tests.processes import die_with_parent, stop_ray_head

pytestmark = pytest.mark.slow

GRACE = 60
GPUS_PER_NODE = 2
GPU_RUN = {**TINY_TRAIN_CONFIG, "mode": "local", "learner_gpus": 2, "actor_memory_mb": 256, "eval_every": 0}
# 0.5-0.7 s a step (0.1 s of tool latency a turn, slept, not computed) and far more steps than the test waits for:
# the control run holds its node to the end (the interactive run can only take the victim's), and neither run's
# tail is waited out. The resumed victim is compared with the control over every step up to AFTER_RESUME steps
# past its checkpoint, then both are cancelled. No sample events: fewer posts to ingest.
AFTER_RESUME = 4
SCHEDULED = {
    **GPU_RUN,
    "task": "agent",
    "tool_latency_s": 0.1,
    "steps": 400,
    "checkpoint_every": 3,
    "samples_groups_per_step": 0,
    "samples_best_worst": False,
    "seed": 5,
}
INTERACTIVE = {**GPU_RUN, "steps": 2}
SETTINGS = {
    "max_total": 4,  # room for a third run: only the GPUs keep the interactive run waiting
    "interactive_reserve": 0,
    "preempt_grace_seconds": GRACE,
    "classes": {"interactive": {"preempts": True}, "schedule": {"preemptible": True}},
}


def _start(cmd: list[str], log_path: Path) -> subprocess.Popen:
    """A Ray node in the foreground (`--block`), its own process group, gone with a killed test run."""
    env = dict(os.environ)
    # Jobs run `python ...` from the raylet's PATH (on either node): this test run's interpreter and repository.
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    with open(log_path, "w") as log:
        return subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent()
        )


def _node_args() -> list[str]:
    return ["--num-gpus", str(GPUS_PER_NODE), "--object-store-memory", str(80 * 1024 * 1024)]


def _both_nodes_up(cluster: RayCluster, procs: list[subprocess.Popen]) -> bool:
    for proc in procs:
        if proc.poll() is not None:
            pytest.fail(f"a Ray node exited:\n{cluster.postmortem()}", pytrace=False)
    try:
        nodes = [n for n in capacity.nodes_read(cluster.dashboard_url) if n.alive]
    except capacity.ClusterUnreachable:
        return False
    return len(nodes) == 2 and all(n.total["GPU"] == GPUS_PER_NODE for n in nodes)


def _group_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _processes_of(temp_dir: str) -> list[str]:
    """Command lines of live processes that name the cluster's temp dir (every Ray process of its nodes does)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and temp_dir in cmdline:
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def _start_head(temp_dir: str) -> tuple[subprocess.Popen, RayCluster] | None:
    """The head node, once its GCS accepts connections; None when it exited on a port clash."""
    ports = {k: free_port() for k in ("gcs", "dashboard", "agent", "client", "metrics")}
    log_path = Path(temp_dir) / "head.log"
    head = _start(head_command(ports=ports, temp_dir=temp_dir) + _node_args(), log_path)
    cluster = RayCluster(
        address=f"127.0.0.1:{ports['gcs']}",
        dashboard_url=f"http://127.0.0.1:{ports['dashboard']}",
        temp_dir=temp_dir,
        head_pid=head.pid,
    )
    wait_for(
        lambda: head.poll() is not None or _listening(ports["gcs"]), timeout=240, interval=0.2, what="the head's GCS"
    )
    if port_clashed(head, log_path):
        stop_ray_head(head)
        return None
    return head, cluster


def _worker_command(cluster: RayCluster) -> list[str]:
    """A second node joining the head, on ports of its own (the agent's HTTP port is otherwise fixed)."""
    return [
        str(VENV_BIN / "ray"),
        "start",
        "--block",
        "--address",
        cluster.address,
        "--num-cpus",
        "2",
        "--dashboard-agent-listen-port",
        str(free_port()),
        "--metrics-export-port",
        str(free_port()),
        "--temp-dir",
        cluster.temp_dir,
        "--disable-usage-stats",
        *_node_args(),
    ]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def ray_jobs_ready() -> Iterator[RayCluster]:
    """Replaces the shared head for this module (the `platform` fixture launches on it): a head and a worker
    node, 2 logical GPUs each, each a `ray start --block` in its own process group; both groups are gone after."""
    temp_dir = tempfile.mkdtemp(prefix="ray-gpu-nodes-")
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(3):  # a port clash (tests/conftest.py PORT_CLASH): once more, on fresh ports
            started = _start_head(temp_dir)
            if started is not None:
                break
        else:
            pytest.fail("the 2-node cluster hit a port clash at three starts in a row", pytrace=False)
        head, cluster = started
        procs = [head, _start(_worker_command(cluster), Path(temp_dir) / "worker.log")]
        wait_for(lambda: _both_nodes_up(cluster, procs), timeout=240, interval=0.5, what="both Ray nodes")
        wait_jobs_accepted(cluster)
        yield cluster
        running = _processes_of(temp_dir)  # what the stop must end (the check below would pass on nothing)
    finally:
        with ThreadPoolExecutor() as pool:  # both at once: each `ray start --block` stops its own node
            list(pool.map(stop_ray_head, procs))
        shutil.rmtree(temp_dir, ignore_errors=True)
    wait_for(lambda: all(_group_gone(proc.pid) for proc in procs), timeout=10, what="the nodes' process groups to end")
    assert len(running) >= 2 and not _processes_of(temp_dir), _processes_of(temp_dir)


def _driver_node(cluster: RayCluster, run_id: int, attempt: int) -> str:
    """The node Ray ran the run's job entrypoint on (its attempt's job): where its driver bundle's GPUs are."""
    jobs = [j for j in ray_jobs_of_run(cluster, run_id) if (j.metadata or {}).get("attempt") == str(attempt)]
    assert len(jobs) == 1 and jobs[0].driver_node_id, jobs
    return str(jobs[0].driver_node_id)


def _trained(api, run_id: int) -> int:
    """The latest step the run reported trained (0: none yet)."""
    events = api.get(f"/api/runs/{run_id}/events/?after=0")
    return max((e["data"]["step"] for e in events if e["type"] == "train"), default=0)


def _checkpointed(api, run_id: int) -> bool:
    events = api.get(f"/api/runs/{run_id}/events/?after=0")
    return any(e["type"] == "checkpoint" and (e["data"].get("step") or 0) >= 3 for e in events)


def test_one_gpu_victim_frees_its_node_and_resumes_exactly(platform, api, ray_jobs_ready):
    cluster = ray_jobs_ready
    platform.start_worker()
    api.patch("/api/settings/concurrency/", SETTINGS)
    log = lambda: platform.log("worker") + platform.log("web")  # noqa: E731

    scheduled = [
        api.post("/api/runs/", {"name": f"schedule-{n}", "origin": "schedule", "config": SCHEDULED}, expect=201)
        for n in range(2)
    ]
    assert all(run["resources"]["total"]["GPU"] == 2.0 for run in scheduled)
    wait_for(
        lambda: all(_checkpointed(api, run["id"]) for run in scheduled),
        timeout=240,
        what="both runs' first checkpoint",
        on_timeout=log,
    )
    nodes = {run["id"]: _driver_node(cluster, run["id"], 0) for run in scheduled}
    assert len(set(nodes.values())) == 2, "the two 2-GPU runs should hold one node each"
    for run in scheduled:  # logical GPUs held, training on the CPU
        started = next(e["data"] for e in api.get(f"/api/runs/{run['id']}/events/?after=0") if e["type"] == "worker")
        assert (started["device"], started["num_gpus"]) == ("cpu", 2.0)

    body = {"name": "interactive", "origin": "dashboard", "config": INTERACTIVE}
    interactive = api.post("/api/runs/", body, expect=201)
    assert interactive["status"] == "queued" and interactive["pending_reason"] == "insufficient_resources"

    # Exactly one victim, asked to stop; it checkpoints and is back in the queue within the grace period.
    row = wait_for(
        lambda: Preemption.objects.filter(preempted_by_id=interactive["id"]).first(), timeout=30, what="a victim"
    )
    victim = row.run_id
    (control,) = [run["id"] for run in scheduled if run["id"] != victim]
    back = api.wait_status(victim, "queued", timeout=GRACE + 10, on_timeout=log)
    row.refresh_from_db()
    assert row.outcome == "checkpointed" and row.lost_steps == 0
    assert (row.ended_at - row.requested_at).total_seconds() <= GRACE
    assert back["position"]["in_class"] == 1 and back["preempted_by"] == interactive["id"]

    # Granted in the requeue's transaction, onto the node the victim freed (the control still holds the other).
    running = api.wait_status(interactive["id"], {"running", "succeeded"}, timeout=300, on_timeout=log)
    to_running = (parse_datetime(running["started_at"]) - parse_datetime(interactive["created_at"])).total_seconds()
    assert _driver_node(cluster, interactive["id"], 0) == nodes[victim]
    assert Preemption.objects.filter(preempted_by_id=interactive["id"]).count() == 1  # exactly one victim
    assert not Preemption.objects.filter(run_id=control).exists()

    # Granted again once the interactive run has ended (the control still holds its node): it resumes at its
    # checkpoint and trains the control run's groups, step for step, as far as both have trained.
    api.wait_status(interactive["id"], "succeeded", timeout=120, on_timeout=log)
    after = row.checkpoint_step + AFTER_RESUME
    wait_for(
        lambda: min(_trained(api, victim), _trained(api, control)) >= after,
        timeout=240,
        what=f"both runs to train step {after}",
        on_timeout=log,
    )
    assert api.run(victim)["preempt_state"] == "resumed" and api.run(control)["preempt_state"] == ""
    events = api.get(f"/api/runs/{victim}/events/?after=0")
    resumed_exactly(events, row.checkpoint_step)
    victim_groups = consumed(events)
    control_groups = consumed(api.get(f"/api/runs/{control}/events/?after=0"))
    both = range(1, min(max(victim_groups), max(control_groups)) + 1)
    assert len(both) >= after and sorted(victim_groups)[: len(both)] == list(both)
    assert {step: victim_groups[step] for step in both} == {step: control_groups[step] for step in both}

    # Neither would end for minutes: cancelled, and stopped on Ray, before the platform goes.
    for run_id in (victim, control):
        api.post(f"/api/runs/{run_id}/cancel/")
    for run_id in (victim, control):
        api.wait_status(run_id, "cancelled", timeout=120, on_timeout=log)
    # Checked last, so that a slow start on a loaded machine still shows whether the resume was exact.
    assert to_running <= GRACE + 30, f"the interactive run was running {to_running:.1f} s after its submit"
