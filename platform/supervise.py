"""The process supervisor of the embedded run command (platform/up.py): start children, stop them in order.

Each child is started from an argv list (no shell in between), in its own session and process group, with a
Linux parent-death signal: if the supervising process dies, even by SIGKILL, the kernel sends every child its
death signal, so no Celery worker, beat tick or Ray head outlives its platform. That signal is SIGTERM, or, for a
child whose own stop cannot be trusted to end once the services beside it are gone (`start(death_signal=...)`),
SIGKILL: nobody is left to SIGKILL it after a grace period. Every line a child prints goes to
<log_dir>/<name>.log when a log directory is given; the terminal gets it, prefixed with the child's name, when
the child's `show` filter passes it (every line by default). A stop signals a child's whole process group and
waits for the group leader; what is left in the group or the child's session after the grace period (or after
the leader exits) is SIGKILLed. The leader is reaped only after that final kill, so its pid, and hence the
group and session id, cannot have been reused.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

PR_SET_PDEATHSIG = 1
HIDDEN_TAIL_LINES = 40  # lines of a child's filtered output kept to print if it exits unexpectedly


def parent_death_signal(sig: int, parent_pid: int):
    """A preexec_fn: ask the kernel to send `sig` to the child when its parent thread dies. If the parent
    died between fork and here, the request would never fire: signal ourselves at once instead."""

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), sig)

    return preexec


def session_members(sid: int) -> list[int]:
    """Pids of the live processes whose session id is `sid` (Linux /proc)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command name: state, ppid, pgrp, session, ...
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    show: Callable[[str], bool] | None = None  # None: every line reaches the terminal
    log: TextIO | None = None  # the child's log file, when the supervisor keeps one
    hidden: deque = field(default_factory=lambda: deque(maxlen=HIDDEN_TAIL_LINES))  # last lines not shown
    reaped: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exited(self) -> bool:
        """Whether the group leader has exited; does not reap it (the zombie keeps the group id ours)."""
        if self.reaped:
            return True
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def signal_group(self, sig: int, *, leader_only: bool = False) -> None:
        """`sig` to the child's process group, or only to its leader (which then stops its own children)."""
        if self.reaped:
            return
        try:
            (os.kill if leader_only else os.killpg)(self.pid, sig)
        except ProcessLookupError:
            pass

    def signal_session(self, sig: int) -> None:
        """Signal every process left in the child's session (Ray puts its workers in groups of their own)."""
        if self.reaped:
            return
        for pid in session_members(self.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def reap(self) -> int | None:
        if not self.reaped:
            self.proc.wait()
            self.reaped = True
        return self.proc.returncode


class Supervisor:
    """Children by name, in start order. All starts must happen on one long-lived thread (the main thread):
    the parent-death signal fires when the thread that forked the child ends."""

    def __init__(self, *, death_signal: int = signal.SIGTERM, out=None, log_dir: Path | None = None) -> None:
        self.children: dict[str, Child] = {}
        self.death_signal = death_signal
        self.out = out or sys.stdout
        self.log_dir = log_dir
        self.last_shown = time.monotonic()  # when the terminal last got a line
        self._print_lock = threading.Lock()

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin=subprocess.DEVNULL,
        show: Callable[[str], bool] | None = None,
        death_signal: int | None = None,
    ) -> Child:
        """Start `argv` as child `name`; `death_signal`: what the kernel sends it if this process dies (default:
        the supervisor's, SIGTERM)."""
        log = None
        if self.log_dir is not None:
            self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            log = open(self.log_dir / f"{name}.log", "a", encoding="utf-8", errors="replace")
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=parent_death_signal(death_signal or self.death_signal, os.getpid()),
        )
        child = Child(name, proc, show=show, log=log)
        self.children[name] = child
        threading.Thread(target=self._pump, args=(child,), daemon=True, name=f"out-{name}").start()
        return child

    def say(self, name: str, line: str) -> None:
        width = max((len(n) for n in self.children), default=len(name))
        self.announce(f"{name:<{width}} | {line}")

    def announce(self, text: str) -> None:
        """Print to the terminal, whole, between children's lines."""
        with self._print_lock:
            try:
                print(text, file=self.out, flush=True)
            except (OSError, ValueError):  # the terminal is gone (SIGHUP): keep stopping, keep draining pipes
                pass
            self.last_shown = time.monotonic()

    def _pump(self, child: Child) -> None:
        assert child.proc.stdout is not None
        for raw in iter(child.proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            if child.log is not None:
                child.log.write(line + "\n")
                child.log.flush()
            if child.show is None or child.show(line):
                self.say(child.name, line)
            else:
                child.hidden.append(line)
        child.proc.stdout.close()
        if child.log is not None:
            child.log.close()

    def first_exited(self) -> Child | None:
        return next((c for c in self.children.values() if c.exited()), None)

    def wait_any(self, stop: threading.Event, poll: float = 0.5) -> Child | None:
        """Block until a child exits (returned) or `stop` is set (None)."""
        while not stop.is_set():
            child = self.first_exited()
            if child is not None:
                return child
            stop.wait(poll)
        return None

    def stop(
        self,
        names: Iterable[str],
        *,
        sig: int = signal.SIGTERM,
        grace: float = 10.0,
        hurry: threading.Event | None = None,
        leaders_only: bool = False,
    ) -> None:
        """Signal the named children's process groups together (`leaders_only`: the group leaders, which stop
        their own children, as a Celery worker's warm shutdown does), wait up to `grace` seconds (less once
        `hurry` is set) for their leaders, then SIGKILL whatever is left in each group and session, and reap."""
        group = [self.children[n] for n in names if n in self.children and not self.children[n].reaped]
        for child in group:
            if not child.exited():
                self.say(child.name, f"stopping (signal {signal.Signals(sig).name}, up to {grace:.0f} s)")
            child.signal_group(sig, leader_only=leaders_only)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not all(c.exited() for c in group):
            if hurry is not None and hurry.is_set():
                break
            time.sleep(0.2)
        for child in group:
            if not child.exited():
                self.say(child.name, f"did not stop within {grace:.0f} s: SIGKILL")
            child.signal_group(signal.SIGKILL)  # stragglers left in the group once the leader is gone
            child.signal_session(signal.SIGKILL)
            child.reap()

    def stop_all(self, grace: float = 10.0) -> None:
        self.stop(reversed(list(self.children)), grace=grace)
