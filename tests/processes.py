"""Stopping the server processes tests start: each runs in its own process group (start_new_session=True)."""
from __future__ import annotations

import os
import signal
import subprocess


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
