"""The embedded run command (platform/up.py) is closed by default and takes its children with it.

Driven from outside: up.py runs as a subprocess on a temporary var/ dir and free ports; what is checked is what
another user of the machine or a dead parent would see (file modes, argv in `ps`, listening sockets, Redis and
Ray answers, processes left behind). The cheap tests point RAY_ADDRESS at a closed port so only Redis, web,
worker and tick start; one slow test runs the real thing with Ray and a training run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import redis
import requests

from tests.conftest import REPO_ROOT, free_port

UP = REPO_ROOT / "platform" / "up.py"


class UpProcess:
    """One `platform/up.py` run; remembers every process it started so the test can check (and clean) them."""

    def __init__(self, tmp_path: Path, **extra_env: str) -> None:
        self.var_dir = tmp_path / "var"
        self.port = free_port()
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in {"DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "RAY_AUTH_MODE", "DJANGO_SECRET_KEY"}
        }
        # These tests are about closing and stopping, not liveness: on a loaded 2-core machine a job's first
        # heartbeat can come after the default 60 s, and a reclaimed run would end the test early.
        env.update(
            {
                "PLATFORM_VAR_DIR": str(self.var_dir),
                "PORT": str(self.port),
                "PYTHONUNBUFFERED": "1",
                "SLOTS_HEARTBEAT_TIMEOUT_SECONDS": "600",
                **extra_env,
            }
        )
        self.log_path = tmp_path / "up.log"
        self.proc = subprocess.Popen(
            [sys.executable, str(UP)],
            cwd=REPO_ROOT,
            env=env,
            start_new_session=True,
            stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT,
        )
        self.seen: dict[int, psutil.Process] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def record(self) -> list[psutil.Process]:
        """Every live descendant of up.py, plus everything in the sessions of its children (Ray's workers and
        job drivers run in groups and sessions of their own)."""
        try:
            found = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            found = []
        sessions = {os.getsid(p.pid) for p in found if p.is_running()} - {os.getsid(self.proc.pid)}
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) in sessions:
                    found.append(p)
            except (ProcessLookupError, psutil.Error):
                pass
        for p in found:
            self.seen.setdefault(p.pid, p)
        return found

    def alive(self) -> list[psutil.Process]:
        out = []
        for p in self.seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out

    def wait_for(self, check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"up.py exited while waiting for {what}:\n{self.log()[-4000:]}"
            try:
                if check():
                    self.record()
                    return
            except (requests.RequestException, OSError):
                pass
            time.sleep(0.5)
        pytest.fail(f"timed out waiting for {what}:\n{self.log()[-4000:]}", pytrace=False)

    def wait_gone(self, timeout: float) -> list[psutil.Process]:
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.alive()

    def cleanup(self) -> None:
        """Kill whatever of ours is still there (only processes this test's up.py started)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for p in self.alive():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        record = self.var_dir / "ray-temp-dir"  # what a killed up.py leaves for its next start to remove
        if record.exists():
            shutil.rmtree(record.read_text().strip(), ignore_errors=True)


@pytest.fixture
def up(tmp_path):
    started: list[UpProcess] = []

    def start(**extra_env: str) -> UpProcess:
        proc = UpProcess(tmp_path, **extra_env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.cleanup()


def start_without_ray(up) -> UpProcess:
    """up.py with Redis, web, worker and tick (Ray pointed at a closed port: launches just wait), verbose: its
    terminal shows every tick."""
    platform = up(RAY_ADDRESS=f"http://127.0.0.1:{free_port()}", VERBOSE="1")
    platform.wait_for(lambda: requests.get(f"{platform.url}/admin/login/", timeout=2).ok, 180, "the web server")
    # The worker's prefork pool and the tick are up once beat has sent a tick and the worker ran it.
    platform.wait_for(lambda: "Task runs.tasks.tick" in platform.log(), 120, "the first tick")
    return platform


def names(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(" ".join(p.cmdline())[:120])
        except psutil.Error:
            pass
    return out


def test_var_is_private_and_no_secret_is_in_argv_and_children_die_on_sigkill(up, tmp_path):
    (tmp_path / "var").mkdir(mode=0o755)  # an older var/ that anyone could enter, with a readable database
    os.chmod(tmp_path / "var", 0o755)
    (tmp_path / "var" / "db.sqlite3").touch()  # an empty file is an empty SQLite database
    os.chmod(tmp_path / "var" / "db.sqlite3", 0o644)
    platform = start_without_ray(up)
    var = platform.var_dir

    assert stat.S_IMODE(var.stat().st_mode) == 0o700
    for name in ("db.sqlite3", "admin-password", "redis-password", "redis.conf", "secret-key"):
        assert stat.S_IMODE((var / name).stat().st_mode) == 0o600, name

    # Redis answers only with the password, on loopback only.
    conf = (var / "redis.conf").read_text()
    port = int(re.search(r"^port (\d+)$", conf, re.M).group(1))
    assert re.search(r"^bind 127\.0\.0\.1$", conf, re.M)
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port, socket_timeout=5).ping()
    password = (var / "redis-password").read_text().strip()
    assert redis.Redis(port=port, password=password, socket_timeout=5).ping()

    # No secret of the platform in any process's arguments (`ps` shows them to every user).
    secrets_ = [password, (var / "admin-password").read_text().strip(), (var / "secret-key").read_text().strip()]
    procs = platform.record()
    assert {"redis", "daphne", "celery"} <= {w for p in names(procs) for w in ("redis", "daphne", "celery") if w in p}
    for cmdline in names(procs) + [" ".join(p.cmdline()) for p in procs if p.is_running()]:
        assert not any(s in cmdline for s in secrets_), cmdline
    for p in procs:
        for conn in p.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                assert conn.laddr.ip in ("127.0.0.1", "::ffff:127.0.0.1"), (names([p]), conn)

    # SIGKILL: up.py has no chance to stop anything; its children must still go (parent-death signal).
    assert len(procs) >= 5, names(procs)  # redis, web, worker (+ its pool), tick
    platform.proc.kill()
    platform.proc.wait(timeout=10)
    left = platform.wait_gone(timeout=45)
    assert not left, f"orphans after SIGKILL of up.py: {names(left)}"


def test_sighup_stops_every_child(up):
    platform = start_without_ray(up)
    assert len(platform.record()) >= 5
    platform.proc.send_signal(signal.SIGHUP)
    assert platform.proc.wait(timeout=120) == 0, platform.log()[-3000:]
    left = platform.wait_gone(timeout=10)
    assert not left, f"left running after SIGHUP: {names(left)}"
    log = platform.log()
    # The tick and the worker stop before the services the rest depends on.
    assert log.index("tick   | stopping") < log.index("web    | stopping") < log.index("redis  | stopping")


def test_supervisor_children_die_with_the_supervisor(tmp_path):
    """The helper itself, with harmless children: SIGKILL the supervising process, the children follow."""
    pids = tmp_path / "pids"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(UP.parent)!r})
        from supervise import Supervisor
        s = Supervisor()
        for name in ("a", "b", "c"):
            s.start(name, ["sleep", "300"])
        open({str(pids)!r}, "w").write(" ".join(str(c.pid) for c in s.children.values()))
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 30
    while not pids.exists() or not pids.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    children = [psutil.Process(int(p)) for p in pids.read_text().split()]
    proc.kill()
    proc.wait(timeout=10)
    gone, alive = psutil.wait_procs(children, timeout=5)
    for p in alive:
        p.kill()
    assert not alive, "children outlived their supervisor"


def trainer_pids(procs: list[psutil.Process]) -> set[int]:
    return {p.pid for p in procs if any("trainer run" in cmd for cmd in names([p]))}


@pytest.mark.slow
def test_real_platform_ray_is_closed_and_ctrl_c_stops_jobs_first(up):
    """The real `make run`: Ray answers only with its token and only on loopback; a training run is stopped
    with a checkpoint on Ctrl-C, after the tick and worker and before Ray, web and Redis; nothing is launched
    once the stop began and nothing is left afterwards."""
    platform = up()
    platform.wait_for(lambda: "The platform is up" in platform.log(), 300, "the banner")
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
        assert token not in " ".join(p.cmdline())

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
    # steps=5000 is far from done and checkpoint_every is 0: a checkpoint can only come from the stop.
    assert list((var / "runs" / str(run["id"]) / "checkpoints").glob("step-*")), log[-4000:]


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


def test_nothing_kills_processes_by_name():
    """CI and the test suite stop only what they started: no pkill/killall/`ray stop` in any script or module."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    pattern = re.compile(r"\b(pkill|killall)\b|\bray\s+stop\b")
    offenders = []
    for name in tracked.stdout.split():
        path = REPO_ROOT / name
        if path.suffix in {".md", ".json", ".lock"} or name.endswith("test_platform.py") or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0] if path.suffix in {".py", ".sh", ".yaml", ".yml", ""} else line
            if pattern.search(code):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert not offenders, offenders


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
