"""platform/supervise.py's ordered stop signals a child's whole process group, or only its leader: a Celery
worker's warm shutdown lets the pool process finish the task at hand, which SIGTERM to the group would end."""

from __future__ import annotations

import io
import sys
import textwrap
import time
from pathlib import Path

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
