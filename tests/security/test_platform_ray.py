"""Ray is closed, embedded and on a cluster: the real `make run` (platform/up.py with its Ray head, started by
the `up` fixture of tests/platform_up.py) answers only with its token and only on loopback, and stops or loses
a training run without leaving a job or process behind; the cluster spec (platform/ray-cluster.yaml) has token
authentication and exposes Ray only inside the cluster. The cheap up.py tests are in test_platform_up.py.
"""

from __future__ import annotations

import re
import signal
import stat
import time
from pathlib import Path

import psutil
import pytest
import requests

from tests.conftest import REPO_ROOT
from tests.platform_up import names, shared_platform, trainer_pids, up  # noqa: F401 - fixtures


@pytest.mark.slow
@pytest.mark.ends_shared_platform
def test_real_platform_ray_is_closed_and_ctrl_c_stops_jobs_first(shared_platform):
    """The real `make run`: Ray answers only with its token and only on loopback; a training run is stopped
    with a checkpoint on Ctrl-C, after the tick and worker and before Ray, web and Redis; nothing is launched
    once the stop began and nothing is left afterwards. On the platform tests/test_capacity.py left (one start
    fewer; its liveness settings are the defaults), or a fresh one when that test did not run or pass."""
    platform = shared_platform.take()
    var = platform.var_dir
    token = (var / "ray-auth-token").read_text().strip()
    assert stat.S_IMODE((var / "ray-auth-token").stat().st_mode) == 0o600
    ray_url = re.search(r"Ray\s+(http://\S+)", platform.log()).group(1)
    assert ray_url.startswith("http://127.0.0.1:")
    assert requests.get(f"{ray_url}/api/jobs/", timeout=10).status_code == 401
    assert requests.get(f"{ray_url}/api/jobs/", timeout=10, headers={"Authorization": f"Bearer {token}"}).ok
    # Ray makes its temp dir (logs, sockets) world-writable; it sits in a directory only we can enter.
    ray_root = Path((var / "ray-temp-dir").read_text().strip())
    assert stat.S_IMODE(ray_root.stat().st_mode) == 0o700
    procs = platform.record()
    for p in procs:
        try:
            conns = p.net_connections(kind="inet")
        except psutil.Error:
            continue
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN:
                assert conn.laddr.ip in ("127.0.0.1", "::ffff:127.0.0.1"), (names([p]), conn)
        try:
            argv = " ".join(p.cmdline())
        except psutil.Error:  # exited since the scan (a zombie has no argv left to leak)
            continue
        assert token not in argv

    api_token = re.search(r"API token (\w+)", platform.log()).group(1)
    headers = {"Authorization": f"Token {api_token}"}
    run = requests.post(
        f"{platform.url}/api/runs/",
        headers=headers,
        timeout=30,
        json={
            "name": "long",
            "origin": "api",
            "kind": "rl_train",
            "config": {"steps": 5000, "prompts_per_step": 16, "eval_every": 0},
        },
    ).json()
    platform.wait_for(lambda: trainer_pids(platform.record()), 300, "the run's trainer process")

    def trained_a_step() -> bool:
        events = requests.get(f"{platform.url}/api/runs/{run['id']}/events/", headers=headers, timeout=10).json()
        return any(e["type"] == "train" for e in events)

    # The trainer checkpoints on a stop once it has trained at least one step.
    platform.wait_for(trained_a_step, 300, "the run's first training step")
    launched_before = trainer_pids(platform.record())

    platform.proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 240
    while platform.proc.poll() is None and time.monotonic() < deadline:
        assert trainer_pids(platform.record()) <= launched_before, "a job was launched after Ctrl-C"
        time.sleep(0.5)
    assert platform.proc.wait(timeout=5) == 0, platform.log()[-4000:]
    left = platform.wait_gone(timeout=10)
    assert not left, f"left running after Ctrl-C: {names(left)}"
    assert not ray_root.exists()

    log = platform.log()
    order = [
        "tick   | stopping",
        "worker | stopping",
        f"stopping Ray job rlrun-{run['id']}-",
        "ray    | stopping",
        "web    | stopping",
        "redis  | stopping",
    ]
    positions = [log.index(line) for line in order]
    assert positions == sorted(positions), log[-4000:]
    stopping = log[log.index("stopping the platform") :]
    # The banner is not printed again among the stop's lines; the worker's pool is not SIGTERMed mid-task.
    assert "The platform is up" not in stopping and "WorkerLostError" not in stopping, stopping
    # steps=5000 is far from done and checkpoint_every is 0: a checkpoint can only come from the stop.
    assert list((var / "runs" / str(run["id"]) / "checkpoints").glob("step-*")), log[-4000:]


@pytest.mark.slow
def test_real_platform_killed_outright_leaves_no_job_or_process(up):
    """SIGKILL of up.py while a training job runs: Ray, the job's driver and every other child go too."""
    platform = up()
    platform.wait_for(lambda: "The platform is up" in platform.log(), 300, "the banner")
    api_token = re.search(r"API token (\w+)", platform.log()).group(1)
    headers = {"Authorization": f"Token {api_token}"}
    requests.post(
        f"{platform.url}/api/runs/",
        headers=headers,
        timeout=30,
        json={"name": "long", "origin": "api", "kind": "rl_train", "config": {"steps": 5000}},
    ).raise_for_status()
    platform.wait_for(lambda: trainer_pids(platform.record()), 300, "the run's trainer process")
    time.sleep(2)
    platform.record()
    platform.proc.kill()
    platform.proc.wait(timeout=10)
    left = platform.wait_gone(timeout=60)
    assert not left, f"left running after SIGKILL of up.py: {names(left)}"


def test_cluster_spec_has_token_auth_and_exposes_ray_only_inside_the_cluster():
    import yaml

    docs = list(yaml.safe_load_all((REPO_ROOT / "platform" / "ray-cluster.yaml").read_text()))
    cluster = next(d for d in docs if d["kind"] == "RayCluster")
    head = cluster["spec"]["headGroupSpec"]
    groups = [head, *cluster["spec"]["workerGroupSpecs"]]
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            env = {e["name"]: e for e in container.get("env", [])}
            assert env["RAY_AUTH_MODE"]["value"] == "token", container["name"]
            assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["key"], container["name"]  # from a Secret
            assert "value" not in env["RAY_AUTH_TOKEN"], "the token must not be written in the spec"
    assert head.get("serviceType") == "ClusterIP"
    assert all(d.get("spec", {}).get("type") not in ("NodePort", "LoadBalancer") for d in docs)
    assert not any(d["kind"] == "Ingress" for d in docs)

    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    own_pods = {"ray.io/cluster": cluster["metadata"]["name"]}
    # Every Ray pod is covered by a policy; any source that is not one of the cluster's own pods may reach only
    # the job API port (8265), and only when it is a platform web/worker pod.
    assert any(p["spec"]["podSelector"]["matchLabels"] == own_pods for p in policies)
    for policy in policies:
        for rule in policy["spec"]["ingress"]:
            for source in rule["from"]:
                if source.get("podSelector", {}).get("matchLabels") == own_pods and "namespaceSelector" not in source:
                    continue
                assert [p["port"] for p in rule.get("ports", [])] == [8265], rule
                components = {
                    v
                    for e in source["podSelector"]["matchExpressions"]
                    if e["key"] == "app.kubernetes.io/component"
                    for v in e["values"]
                }
                assert components == {"web", "worker"}, rule
