"""The server processes tests start: the database they share with the test, and stopping them (each runs in its
own process group, start_new_session=True)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM):
    """A preexec_fn: the kernel sends the child `sig` when the process that started it dies, even by SIGKILL,
    so a killed test run leaves no server behind (and nothing has to be cleaned up by name later). The kernel
    ties it to the thread that started the child: start such children from the main thread only (a server a
    test restarts from another thread would get `sig` when that thread ends)."""
    parent = os.getpid()

    def preexec() -> None:
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before the request was in place
            os.kill(os.getpid(), sig)

    return preexec


def stop_process_group(proc: subprocess.Popen | None, *, sig: int = signal.SIGTERM, grace: float = 15) -> None:
    """Signal the whole group (a server and its children), then SIGKILL it if it outlives `grace` seconds."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def stop_ray_head(proc: subprocess.Popen | None, *, grace: float = 20) -> None:
    """Stop a test head (`ray start --head --block`, its own process group): SIGINT makes `ray start` stop its
    cluster and exit in about 2 s and the rest of the group follows within a few more (measured; on SIGTERM it
    took 33 s). What of the group outlives `grace` is killed: only this group, never every Ray of the machine."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)  # anything of the group still alive?
        except ProcessLookupError:
            break
        proc.poll()  # reap the leader, so that only live members keep the group
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def committed_database_url(needs: str) -> str:
    """The test database as a URL for the server processes a test starts (they see what it has committed).
    `needs` names the tests in the failure when the suite does not run on PostgreSQL."""
    from django.db import connection

    assert connection.vendor == "postgresql", f"{needs} need PostgreSQL (set DATABASE_URL)"
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
