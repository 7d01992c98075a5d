"""A sandboxed code tool: `run_snippet(code)` runs a model's snippet confined and returns what happened.

Owns the caller's side: limits (`SandboxLimits`), the result (`SandboxResult`), at most K snippets at once per
process (`Sandbox`, an asyncio semaphore), the subprocess (asyncio, no shell, an empty environment, its own
session), the wall timeout (SIGKILL to the launcher's process group and to the snippet's PID-namespace init),
the output caps and the temporary directory (removed afterwards). The confinement itself (namespaces, read-only
mounts, a dedicated uid, rlimits) is `agents/sandbox_init.py`'s; docs/agents.md "Sandbox" says what it is,
what it does not cover, and why it refuses ("sandbox_unavailable") rather than run unconfined.

Nothing the snippet does raises out of `run_snippet`: every failure is a `SandboxResult` with `ok=False`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

LAUNCHER = Path(__file__).with_name("sandbox_init.py")
REPO_ROOT = LAUNCHER.parent.parent
# Dedicated uids: nothing on the machine owns files as them (docs/agents.md). Each snippet gets one not in use by
# another snippet of this process, so the per-uid process limit is its own.
DEFAULT_UIDS = range(1_500_000_000, 1_500_000_000 + 1_000_000)
# The interpreter of the launcher and of the snippet: outside every hidden path (not a venv under the repo or
# /root) and runnable by the sandbox uid. A missing one is "sandbox_unavailable".
DEFAULT_PYTHON = "/usr/bin/python3"
MAX_CODE_BYTES = 64 * 1024
LANGUAGES = ("python",)


@dataclass(frozen=True)
class SandboxLimits:
    """What one snippet may use. Every field is bounded; a value out of bounds is a ValueError naming it."""

    cpu_s: int = 2  # RLIMIT_CPU of each process (seconds)
    wall_s: float = 5.0  # the whole run, then the process group and namespace are killed
    memory_bytes: int = 256 * 1024 * 1024  # RLIMIT_AS (address space) of each process
    file_bytes: int = 1024 * 1024  # RLIMIT_FSIZE: largest file it may write
    disk_bytes: int = 4 * 1024 * 1024  # size of its tmpfs working directory
    processes: int = 16  # RLIMIT_NPROC for its uid (the snippet's own processes)
    open_files: int = 64  # RLIMIT_NOFILE
    output_bytes: int = 64 * 1024  # cap of stdout and of stderr each; more and it is killed

    def __post_init__(self) -> None:
        bounds = {
            "cpu_s": (1, 60),
            "wall_s": (0.5, 120),
            "memory_bytes": (64 * 1024 * 1024, 4 * 1024**3),
            "file_bytes": (0, 64 * 1024 * 1024),
            "disk_bytes": (64 * 1024, 256 * 1024 * 1024),
            "processes": (1, 256),
            "open_files": (16, 1024),
            "output_bytes": (1024, 4 * 1024 * 1024),
        }
        for field in fields(self):
            value = getattr(self, field.name)
            low, high = bounds[field.name]
            if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
                raise ValueError(f"SandboxLimits.{field.name}: {value!r} is not within [{low}, {high}]")


@dataclass(frozen=True)
class SandboxResult:
    """What happened. `ok` only when the snippet exited 0 within every limit; `error` names the first failure:
    "timeout" (CPU or wall), "memory", "file_size", "output_limit", "killed" (another signal), "exit_code",
    "code_too_large", "unsupported_language", "sandbox_unavailable". `detail` is one sentence for the tool reply."""

    ok: bool
    stdout: str
    stderr: str
    exit_code: int | None  # negative: killed by that signal; None: it never ran
    error: str | None
    wall_s: float
    cpu_s: float
    detail: str = ""


def refused(error: str, detail: str) -> SandboxResult:
    return SandboxResult(False, "", "", None, error, 0.0, 0.0, detail)


class Sandbox:
    """At most `max_concurrent` snippets at once in this process; the others wait their turn."""

    def __init__(self, max_concurrent: int = 4, uids: range = DEFAULT_UIDS, python: str = DEFAULT_PYTHON) -> None:
        if not 1 <= max_concurrent <= 64:
            raise ValueError(f"Sandbox.max_concurrent: {max_concurrent!r} is not within [1, 64]")
        if len(uids) < max_concurrent or uids.start <= 0:
            raise ValueError("Sandbox.uids: needs at least max_concurrent uids, none of them root")
        self.max_concurrent = max_concurrent
        self.uids = uids
        self.python = python
        self._in_use: set[int] = set()
        self._semaphore: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _gate(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._loop is not loop:  # a semaphore belongs to one event loop
            self._semaphore, self._loop = asyncio.Semaphore(self.max_concurrent), loop
        return self._semaphore

    async def run(self, code: str, *, language: str = "python", limits: SandboxLimits | None = None) -> SandboxResult:
        limits = limits or SandboxLimits()
        if language not in LANGUAGES:
            return refused("unsupported_language", f"language {language!r} is not one of {list(LANGUAGES)}")
        if not isinstance(code, str):
            return refused("unsupported_language", "code must be a string")
        data = code.encode("utf-8", errors="replace")
        if len(data) > MAX_CODE_BYTES:
            return refused("code_too_large", f"code is {len(data)} bytes, over the {MAX_CODE_BYTES}-byte limit")
        if os.geteuid() != 0:
            return refused("sandbox_unavailable", "the sandbox needs root (namespaces, mounts, a separate uid)")
        async with self._gate():
            uid = random.choice(self.uids)
            while uid in self._in_use:  # fewer than max_concurrent are, of at least as many uids
                uid = random.choice(self.uids)
            self._in_use.add(uid)
            try:
                return await _run_confined(data, uid, self.python, limits)
            finally:
                self._in_use.discard(uid)


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


_default: Sandbox | None = None


def default_sandbox() -> Sandbox:
    """This process's sandbox; K from AGENTS_SANDBOX_CONCURRENCY (default 4). Replace it with `set_default`."""
    global _default
    if _default is None:
        _default = Sandbox(int(os.environ.get("AGENTS_SANDBOX_CONCURRENCY", "4")))
    return _default


def set_default(sandbox: Sandbox) -> None:
    global _default
    _default = sandbox


async def run_snippet(code: str, *, language: str = "python", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` in the process's default sandbox (see `Sandbox.run`)."""
    return await default_sandbox().run(code, language=language, limits=limits)
