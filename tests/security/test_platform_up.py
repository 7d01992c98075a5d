"""The embedded run command (platform/up.py) is closed by default and takes its children with it.

Driven from outside: up.py runs as a subprocess on a temporary var/ dir and free ports (tests/platform_up.py);
what is checked is what another user of the machine or a dead parent would see (file modes, argv in `ps`,
listening sockets, Redis answers, processes left behind). These tests point RAY_ADDRESS at a closed port so only
Redis, web, worker and tick start; the real thing with Ray is in test_platform_ray.py. Also: the supervisor helper
on its own, and no script or module that kills processes by name.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import redis

from tests.conftest import REPO_ROOT
from tests.platform_up import UP, names, start_without_ray, up  # noqa: F401 - up: the fixture

pytestmark = pytest.mark.beside  # its own platforms: in the pytest beside the suite (Makefile)


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


def test_nothing_kills_processes_by_name():
    """CI and the test suite stop only what they started: no pkill/killall/`ray stop` in any script or module."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    pattern = re.compile(r"\b(pkill|killall)\b|\bray\s+stop\b")
    offenders = []
    for name in tracked.stdout.split():
        path = REPO_ROOT / name
        if path.suffix in {".md", ".json", ".lock"} or name.endswith("test_platform_up.py") or not path.is_file():
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
