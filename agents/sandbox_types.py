"""What the code tool's sandbox (agents/sandbox.py) takes and gives: `SandboxLimits`, what one snippet may use
(every field bounded; a value out of bounds is a ValueError naming it), and `SandboxResult`, what happened to it
(`refused` builds the result of a snippet that never ran). docs/agents.md, "Sandbox".
"""

from __future__ import annotations

from dataclasses import dataclass, fields


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
