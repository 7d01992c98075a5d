"""The quiet-machine locks (tests/quiet.py), in threads on a directory of their own: a timing test waits for
the test beside that is running, and no test beside starts until the timing test has ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from tests.conftest import REPO_ROOT
from tests.quiet import beside, quiet


def test_a_timing_test_waits_for_the_running_test_beside_and_holds_back_the_next(tmp_path):
    events: list[str] = []
    running = threading.Event()
    release = threading.Event()

    def first_beside() -> None:
        with beside(tmp_path):
            events.append("beside 1 runs")
            running.set()
            release.wait(10)
            events.append("beside 1 ends")

    def timing() -> None:
        with quiet(tmp_path) as waited:
            events.append(f"timing runs after {waited:.1f} s")
            time.sleep(0.3)
            events.append("timing ends")

    def second_beside() -> None:
        with beside(tmp_path):
            events.append("beside 2 runs")

    threads = [threading.Thread(target=first_beside)]
    threads[0].start()
    assert running.wait(10)
    threads.append(threading.Thread(target=timing))
    threads[1].start()
    time.sleep(0.3)  # the timing test now waits at quiet.held with the gate closed
    threads.append(threading.Thread(target=second_beside))
    threads[2].start()
    time.sleep(0.3)
    assert events == ["beside 1 runs"], events
    release.set()
    for t in threads:
        t.join(10)
    assert [e.split(" after")[0] for e in events] == [
        "beside 1 runs",
        "beside 1 ends",
        "timing runs",
        "timing ends",
        "beside 2 runs",
    ]
    assert float(events[2].split("after ")[1].split()[0]) >= 0.5


def test_tests_beside_run_together_and_a_lone_timing_test_does_not_wait(tmp_path):
    with beside(tmp_path), beside(tmp_path):
        pass  # shared: two at once (the suite's single test beside, twice, would not block itself)
    with quiet(tmp_path) as waited:
        assert waited < 1


SLEEPER = """
import time


def test_sleeps():
    print("sleeping", flush=True)
    time.sleep(120)
"""


def test_a_pytest_started_in_the_background_by_sh_stops_on_ctrl_c(tmp_path):
    """As the Makefile starts the tests beside: `sh -c '... pytest ... & wait'`, where the job starts with SIGINT
    ignored. With tests/quiet.py loaded, SIGINT interrupts it (exit status 2, KeyboardInterrupt)."""
    (tmp_path / "test_sleeper.py").write_text(SLEEPER)
    pytest_cmd = f"{sys.executable} -m pytest -s -p tests.quiet -p no:django -p no:cacheprovider -c /dev/null"
    job = f"{pytest_cmd} --rootdir {tmp_path} {tmp_path}/test_sleeper.py > {tmp_path}/out 2>&1"
    script = f"{job} & echo $! > {tmp_path}/pid; wait"
    shell = subprocess.Popen(["sh", "-c", script], cwd=REPO_ROOT, start_new_session=True)
    try:
        out = tmp_path / "out"
        deadline = time.monotonic() + 60
        while "sleeping" not in (out.read_text() if out.exists() else ""):
            assert time.monotonic() < deadline and shell.poll() is None, out.read_text() if out.exists() else ""
            time.sleep(0.2)
        os.kill(int((tmp_path / "pid").read_text()), signal.SIGINT)
        assert shell.wait(timeout=20) == 0  # `wait` with a job that ended is 0 in dash whatever the job's status
        text = out.read_text()
        assert "KeyboardInterrupt" in text and "1 passed" not in text, text[-2000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
