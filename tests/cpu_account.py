"""pytest plugin (loaded by pytest.ini's `-p`): the CPU each test costs the machine, for the question "how fast
can this suite be on 2 cores?". Off unless PYTEST_CPU_ACCOUNT names an output file.

Wall time (`--durations`) cannot answer it: a test that waits on a Ray job spends its CPU in processes that are
not its children by the time they exit (Ray workers, a `make run` platform), and the rusage of pytest never
sees them. A cgroup does: every process forked below this pytest stays in it, reparented or not. So when on,
the plugin puts this pytest into a cpuacct cgroup of its own (cgroup v1, writable by root on the test
machines; it fails loudly when it cannot) and reads the cgroup's counter around each test (setup, call and
teardown together). What the shared Ray head or a shared platform burns while idle lands on the test that runs
at that moment; the total is exact.

The file gets one line per test, `cpu_s wall_s node_id`, most CPU first, under a header with the totals.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

CGROUPS = Path("/sys/fs/cgroup/cpuacct")


class CpuAccount:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.group = CGROUPS / f"pytest-{os.getpid()}"
        self.group.mkdir(exist_ok=True)
        (self.group / "cgroup.procs").write_text(str(os.getpid()))
        self.rows: list[tuple[float, float, str]] = []
        self.started = (self.usage(), time.monotonic())

    def usage(self) -> float:
        """CPU seconds (user and system) of every process in the cgroup since it was made."""
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        cpu, wall = self.usage(), time.monotonic()
        yield
        self.rows.append((self.usage() - cpu, time.monotonic() - wall, item.nodeid))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        cpu, wall = self.usage() - self.started[0], time.monotonic() - self.started[1]
        lines = [
            f"# CPU per test: cgroup {self.group} (every process this pytest started), setup+call+teardown",
            f"# total: {cpu:.1f} CPU s in {wall:.1f} s wall ({cpu / max(wall, 1e-9):.2f} cores on average);"
            f" tests: {sum(r[0] for r in self.rows):.1f} CPU s",
        ]
        lines += [f"{c:.2f} {w:.2f} {node}" for c, w, node in sorted(self.rows, reverse=True)]
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text("\n".join(lines) + "\n")
        # Back to the root group; the group goes when empty (a child still alive keeps it: harmless, empty later).
        (CGROUPS / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):
            self.group.rmdir()


def pytest_configure(config: pytest.Config) -> None:
    out = os.environ.get("PYTEST_CPU_ACCOUNT")
    if not out:
        return
    if not CGROUPS.is_dir() or not os.access(CGROUPS, os.W_OK):
        raise pytest.UsageError(f"PYTEST_CPU_ACCOUNT is set but {CGROUPS} is not a writable cpuacct hierarchy")
    config.pluginmanager.register(CpuAccount(Path(out)), "cpu_account")
