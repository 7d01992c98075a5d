"""Running one snippet confined, the sandbox's subprocess side (agents/sandbox.py `Sandbox.run` calls
`_run_confined`): the snippet written to a temporary directory (removed afterwards), the launcher
(agents/sandbox_init.py, which does the confinement as root) started with asyncio, no shell, an empty environment
and its own session, its output read and capped, the wall timeout (SIGKILL to the snippet's PID-namespace init
and to the launcher's process group), the launcher's status pipe, and what happened as a `SandboxResult`
(`_classify`: timeout, memory, file size, output limit, killed, exit code). docs/agents.md, "Sandbox".
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from agents.sandbox_types import SandboxLimits, SandboxResult, refused

LAUNCHER = Path(__file__).with_name("sandbox_init.py")
REPO_ROOT = LAUNCHER.parent.parent


async def _run_confined(code: bytes, uid: int, python: str, limits: SandboxLimits) -> SandboxResult:
    tmp = tempfile.mkdtemp(prefix="agents-sandbox-")
    status_read, status_write = os.pipe()
    started = time.monotonic()
    try:
        code_path = os.path.join(tmp, "snippet.py")
        with open(code_path, "wb") as f:
            f.write(code)
        config = {
            "code_path": code_path,
            "uid": uid,
            "gid": uid,
            "python": python,
            "hide": [str(REPO_ROOT)],
            "disk_bytes": limits.disk_bytes,
            "status_fd": status_write,
            "rlimits": {
                "cpu": limits.cpu_s,
                "as": limits.memory_bytes,
                "fsize": limits.file_bytes,
                "nproc": limits.processes,
                "nofile": limits.open_files,
            },
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                python,
                "-I",
                "-S",
                "-B",
                str(LAUNCHER),
                json.dumps(config),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={},
                cwd=tmp,
                start_new_session=True,
                pass_fds=(status_write,),
            )
        except OSError as exc:  # no interpreter to launch with: nothing ran
            return refused("sandbox_unavailable", f"cannot start the sandbox launcher: {exc}")
        os.close(status_write)
        status_write = -1
        return await _supervise(proc, StatusPipe(status_read), limits, started)
    finally:
        if status_write >= 0:
            os.close(status_write)
        os.close(status_read)
        shutil.rmtree(tmp, ignore_errors=True)


async def _supervise(
    proc: asyncio.subprocess.Process, status: StatusPipe, limits: SandboxLimits, started: float
) -> SandboxResult:
    assert proc.stdout is not None and proc.stderr is not None
    over_cap = asyncio.Event()
    outputs = [bytearray(), bytearray()]

    async def drain(stream: asyncio.StreamReader, into: bytearray) -> None:
        while chunk := await stream.read(65536):  # to the end: past the cap, read and drop until it is killed
            room = limits.output_bytes - len(into)
            into += chunk[: max(room, 0)]
            if len(chunk) > room:
                over_cap.set()

    readers = [asyncio.ensure_future(drain(s, b)) for s, b in ((proc.stdout, outputs[0]), (proc.stderr, outputs[1]))]
    finished: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*readers, proc.wait()))
    cap_hit: asyncio.Future[Any] = asyncio.ensure_future(over_cap.wait())
    killed_for = None
    try:
        await asyncio.wait({finished, cap_hit}, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED)
        if over_cap.is_set():
            killed_for = "output_limit"
        elif not finished.done():
            killed_for = "timeout"
        if killed_for:
            _kill(proc, status, group=False)
        # Its writers are dead once the namespace is: the pipes end, then the launcher reports and exits.
        done, _ = await asyncio.wait({finished}, timeout=2)
        if not done:
            _kill(proc, status, group=True)
            await asyncio.wait({finished}, timeout=2)
    finally:
        for task in (*readers, finished, cap_hit):
            task.cancel()
    wall_s = time.monotonic() - started
    stdout, stderr = (bytes(b).decode("utf-8", errors="replace") for b in outputs)
    report = status.poll() or {"error": f"the launcher reported nothing (stderr: {stderr[-500:]!r})"}
    if "error" in report:
        return SandboxResult(False, "", "", None, "sandbox_unavailable", wall_s, 0.0, report["error"])
    cpu_s = float(report.get("cpu_s", 0.0))
    exit_code = os.waitstatus_to_exitcode(report["status"]) if "status" in report else None
    error, detail = _classify(killed_for, exit_code, cpu_s, stderr, limits)
    return SandboxResult(error is None, stdout, stderr, exit_code, error, wall_s, cpu_s, detail)


def _classify(
    killed_for: str | None, exit_code: int | None, cpu_s: float, stderr: str, limits: SandboxLimits
) -> tuple[str | None, str]:
    tail = stderr[-2000:]
    if killed_for == "output_limit":
        return "output_limit", f"output over {limits.output_bytes} bytes: cut there and the snippet killed"
    if killed_for == "timeout":
        return "timeout", f"wall time over {limits.wall_s} s: killed"
    # The kernel kills at the RLIMIT_CPU hard limit; the rusage it reports can read a little under it.
    if exit_code in (-signal.SIGKILL, -signal.SIGXCPU) and cpu_s >= 0.8 * limits.cpu_s:
        return "timeout", f"CPU time over {limits.cpu_s} s: killed"
    if "MemoryError" in tail or exit_code == -signal.SIGSEGV:
        return "memory", f"memory over {limits.memory_bytes} bytes"
    if "File too large" in tail or exit_code == -signal.SIGXFSZ:
        return "file_size", f"a file over {limits.file_bytes} bytes"
    if exit_code is None or exit_code < 0:
        return "killed", f"killed by signal {-exit_code}" if exit_code else "ended without a status"
    if exit_code != 0:
        return "exit_code", f"exited with {exit_code}"
    return None, ""


class StatusPipe:
    """The read end of the launcher's status pipe: JSON lines ({"child": pid}, {"status", "cpu_s"}, {"error"})."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = b""
        os.set_blocking(fd, False)

    def poll(self) -> dict[str, Any]:
        """Read what is there now (all of it once the launcher is gone) and merge the lines."""
        try:
            while chunk := os.read(self.fd, 65536):
                self.data += chunk
        except BlockingIOError:
            pass
        report: dict[str, Any] = {}
        for line in self.data.decode(errors="replace").splitlines():
            try:
                report |= json.loads(line)
            except ValueError:
                report.setdefault("error", f"unreadable launcher status {line[:200]!r}")
        return report


def _kill(proc: asyncio.subprocess.Process, status: StatusPipe, group: bool) -> None:
    """SIGKILL the snippet's PID-namespace init: its whole tree dies with it, and the launcher, still alive to
    report its status, has not reaped it yet, so the pid cannot have been reused. `group`: the launcher's
    process group too (the launcher is hung, or it has not said the init's pid yet)."""
    child = status.poll().get("child")
    targets = [(child, os.kill)] if isinstance(child, int) and child > 0 else []
    if group or not targets:
        targets.append((proc.pid, os.killpg))
    for target, send in targets:
        try:
            send(target, signal.SIGKILL)
        except ProcessLookupError:
            pass
