"""A sandboxed code tool: `run_snippet(code)` runs a model's snippet confined and returns what happened.

Owns the caller's side: limits (`SandboxLimits`), the result (`SandboxResult`), at most K snippets at once per
process (`Sandbox`, an asyncio semaphore), the subprocess (asyncio, no shell, an empty environment, its own
session), the wall timeout (SIGKILL to the launcher's process group and to the snippet's PID-namespace init),
the output caps and the temporary directory (removed afterwards). The confinement itself (namespaces, read-only
mounts, a dedicated uid, rlimits) is `agents/sandbox_init.py`'s; docs/agents.md "Sandbox" says what it is,
what it does not cover, and why it refuses ("sandbox_unavailable") rather than run unconfined.

Here: the checks before anything runs, the concurrency bound, the uid draw and the process's default sandbox.
The limits and the result are declared in agents/sandbox_types.py; the subprocess, its timeout, output caps and
temporary directory are agents/sandbox_process.py's.

Nothing the snippet does raises out of `run_snippet`: every failure is a `SandboxResult` with `ok=False`.
"""

from __future__ import annotations

import asyncio
import os
import random

from agents.sandbox_process import _run_confined
from agents.sandbox_types import SandboxLimits, SandboxResult, refused

# Dedicated uids: nothing on the machine owns files as them (docs/agents.md). Each snippet gets one not in use by
# another snippet of this process, so the per-uid process limit is its own.
DEFAULT_UIDS = range(1_500_000_000, 1_500_000_000 + 1_000_000)
# The interpreter of the launcher and of the snippet: outside every hidden path (not a venv under the repo or
# /root) and runnable by the sandbox uid. A missing one is "sandbox_unavailable".
DEFAULT_PYTHON = "/usr/bin/python3"
MAX_CODE_BYTES = 64 * 1024
LANGUAGES = ("python",)


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
