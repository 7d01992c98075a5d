"""platform/supervise.py's ordered stop signals a child's whole process group, or only its leader: a Celery
worker's warm shutdown lets the pool process finish the task at hand, which SIGTERM to the group would end. And a
killed supervisor's children get their parent-death signal: SIGTERM, or SIGKILL where it was asked for."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "platform"))
from supervise import Supervisor  # noqa: E402

# A pool process mid-task: SIGTERM ends it and says so.
POOL = """
import signal, sys, time
from pathlib import Path
def on_term(*_):
    Path(sys.argv[1], "pool").write_text("ended mid-task")
    sys.exit(1)
signal.signal(signal.SIGTERM, on_term)
Path(sys.argv[1], "ready").write_text("")
time.sleep(60)
"""

# The worker: on SIGTERM it lets its task finish, then ends its pool itself.
LEADER = """
import signal, subprocess, sys, time
from pathlib import Path
pool = subprocess.Popen([sys.executable, "-c", {pool!r}, sys.argv[1]])
def on_term(*_):
    time.sleep(0.3)
    Path(sys.argv[1], "leader").write_text("task finished")
    pool.kill()
    pool.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
time.sleep(60)
"""


@pytest.mark.parametrize("leaders_only", [True, False])
def test_a_leaders_only_stop_lets_the_leader_end_its_own_group(tmp_path: Path, leaders_only: bool) -> None:
    supervisor = Supervisor(out=io.StringIO())
    script = textwrap.dedent(LEADER).format(pool=textwrap.dedent(POOL))
    supervisor.start("worker", [sys.executable, "-c", script, str(tmp_path)])
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline, "the pool process did not start"
        time.sleep(0.05)
    time.sleep(0.2)  # the leader's handler too (installed right after it started the pool)
    supervisor.stop(["worker"], grace=10, leaders_only=leaders_only)
    assert (tmp_path / "leader").read_text() == "task finished"
    if leaders_only:
        assert not (tmp_path / "pool").exists()  # the leader ended it, after its task
    else:
        assert (tmp_path / "pool").read_text() == "ended mid-task"
    assert supervisor.children["worker"].reaped


# A child that answers SIGTERM by writing a file and exiting, or (`stubborn`) by carrying on: a warm shutdown
# stuck on services that are stopping with it.
CHILD = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def on_term(*_):
    (out / "sigterm").write_text("")
    if out.name != "stubborn":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
(out / "ready").write_text("")
time.sleep(120)
"""

# A supervisor in a process of its own (the parent-death signal fires when it dies): three children, their pids
# written to its directory, then it waits to be killed.
SUPERVISOR = """
import io, json, signal, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from supervise import Supervisor
root, child = Path(sys.argv[1]), sys.argv[3]
supervisor = Supervisor(out=io.StringIO())
pids = {}
for name, sig in (("polite", None), ("stubborn", signal.SIGKILL), ("stubborn-default", None)):
    (root / name).mkdir()
    out = root / name / ("stubborn" if name.startswith("stubborn") else "polite")
    out.mkdir()
    pids[name] = supervisor.start(name, [sys.executable, "-c", child, str(out)], death_signal=sig).pid
(root / "pids.json").write_text(json.dumps(pids))
time.sleep(120)
"""


def test_a_child_started_with_death_signal_sigkill_dies_with_a_killed_supervisor(tmp_path: Path) -> None:
    sup = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(tmp_path), str(REPO_ROOT / "platform"), textwrap.dedent(CHILD)]
    )
    children: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "pids.json").exists() or len(list(tmp_path.glob("*/*/ready"))) < 3:
            assert time.monotonic() < deadline, "the supervisor's children did not start"
            time.sleep(0.05)
        children = json.loads((tmp_path / "pids.json").read_text())
        os.kill(sup.pid, signal.SIGKILL)
        sup.wait(timeout=10)

        def gone(pid: int) -> bool:
            try:
                return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        deadline = time.monotonic() + 10
        while not (gone(children["polite"]) and gone(children["stubborn"])):
            assert time.monotonic() < deadline, {name: gone(pid) for name, pid in children.items()}
            time.sleep(0.05)
        assert (tmp_path / "polite" / "polite" / "sigterm").exists()  # the default: SIGTERM, and it stopped
        assert not (tmp_path / "stubborn" / "stubborn" / "sigterm").exists()  # SIGKILL: no handler ran
        # Without it, a child that does not end on SIGTERM outlives its supervisor: what SIGKILL is for.
        time.sleep(1)
        assert (tmp_path / "stubborn-default" / "stubborn" / "sigterm").exists()
        assert not gone(children["stubborn-default"])
    finally:
        if sup.poll() is None:
            sup.kill()
        for pid in children.values():
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
