"""The CPU-per-test plugin (tests/cpu_account.py) counts what a test's processes burn after they left it: a
grandchild that outlives its parent (reparented, never waited for by pytest) still lands on its test."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT

SPIN = """
import time
t = time.process_time()
while time.process_time() - t < 1.5:
    pass
"""
# The child starts the spinner and exits at once: the spinner is reparented, and pytest never waits for it.
BURNER = """
import subprocess, sys, time

def test_burns_in_an_orphan():
    starter = "import subprocess, sys; subprocess.Popen([sys.executable, 'spin.py'])"
    subprocess.run([sys.executable, "-c", starter], check=True)
    time.sleep(3.0)

def test_sleeps():
    time.sleep(0.5)
"""


def test_an_orphans_cpu_lands_on_its_test(tmp_path):
    (tmp_path / "test_burn.py").write_text(BURNER)
    (tmp_path / "spin.py").write_text(SPIN)
    out = tmp_path / "cpu.txt"
    env = {**os.environ, "PYTEST_CPU_ACCOUNT": str(out), "PYTHONPATH": str(REPO_ROOT)}
    args = ["-q", "-p", "no:randomly", "-p", "tests.cpu_account", "-c", "/dev/null", "--rootdir", str(tmp_path)]
    subprocess.run(
        [sys.executable, "-m", "pytest", *args, "test_burn.py"],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    lines = out.read_text().splitlines()
    rows = {}
    for line in lines[2:]:
        cpu, wall, node = line.split()
        rows[node.split("::")[1]] = (float(cpu), float(wall))
    assert rows["test_burns_in_an_orphan"][0] >= 1.4, lines
    assert rows["test_sleeps"][0] < 0.3 and rows["test_sleeps"][1] >= 0.5, lines
    assert lines[1].startswith("# total:"), lines
