"""A quiet machine for a test that measures time against a baseline (pytest plugin, pytest.ini).

`make test` runs the tests marked `beside` in a second pytest next to the suite (Makefile). Most of them train
runs on platforms of their own and keep a core busy for minutes, so a timing test of the suite measured its
baseline while they ran and its crowd while they did not, or the other way round (in CI, test_capacity's two
single runs took 23.5 and 18.2 s, and its crowd 1.256 times their mean).

A timing test asks for `quiet_machine`: it closes the gate to new tests beside (exclusive lock on var/quiet.gate),
then waits for the one running to end (exclusive lock on var/quiet.held). Every `beside` test passes the gate and
holds quiet.held shared while it runs. The outage tests are left out: they mostly wait out their own Ray head's
outages (0.3 of a core on average), and one of them can take five minutes, which the waiting test's own 600 s
timeout could not absorb. Two pytests only: in one pytest the tests run one after another and nothing waits.
"""

from __future__ import annotations

import fcntl
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest

LOCKS = Path(__file__).resolve().parents[1] / "var"


def _open(locks: Path, name: str) -> IO[str]:
    locks.mkdir(exist_ok=True)
    return open(locks / name, "a")


@contextmanager
def quiet(locks: Path = LOCKS) -> Iterator[float]:
    """Close the gate, then wait for the test beside to end; gives the seconds waited."""
    asked = time.monotonic()
    with _open(locks, "quiet.gate") as gate, _open(locks, "quiet.held") as held:  # closing a file releases it
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(held, fcntl.LOCK_EX)
        yield time.monotonic() - asked


@contextmanager
def beside(locks: Path = LOCKS) -> Iterator[None]:
    """Pass the gate (wait while a timing test holds it), then hold quiet.held shared until the end."""
    with _open(locks, "quiet.gate") as gate, _open(locks, "quiet.held") as held:
        fcntl.flock(gate, fcntl.LOCK_SH)
        fcntl.flock(held, fcntl.LOCK_SH)
        gate.close()
        yield


def pytest_configure(config: pytest.Config) -> None:
    """The second pytest takes Ctrl-C as the first does. `make test` starts it with `&`, and a shell without job
    control starts such a job with SIGINT ignored: Ctrl-C on `make test` ended the suite and left the second
    pytest running on, its platforms and Ray heads with it. Now it raises KeyboardInterrupt, and each fixture's
    teardown stops what it started."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def quiet_machine() -> Iterator[None]:
    """No test beside this one while it runs (the one running when it asks is waited for)."""
    with quiet() as waited:
        if waited > 1:
            print(f"quiet_machine: waited {waited:.0f} s for the test beside to end", file=sys.stderr)
        yield


@pytest.fixture(autouse=True)
def _beside_yields_to_quiet(request: pytest.FixtureRequest) -> Iterator[None]:
    node = request.node
    if not node.get_closest_marker("beside") or node.get_closest_marker("outage"):
        yield
        return
    with beside():
        yield
