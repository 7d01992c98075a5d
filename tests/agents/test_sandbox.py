"""agents.sandbox on real subprocesses: every escape attempt is contained and comes back as a tool error."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import pytest

from agents.sandbox import MAX_CODE_BYTES, Sandbox
from agents.sandbox_types import SandboxLimits, SandboxResult

REPO_ROOT = Path(__file__).resolve().parents[2]
UIDS = range(1_600_000_000, 1_600_000_000 + 1000)  # this module's sandbox uids, to find leftovers by owner
FAST = SandboxLimits(cpu_s=1, wall_s=3.0)


@pytest.fixture(autouse=True)
def _root() -> None:
    """These tests need what the sandbox needs (root: namespaces, a dedicated uid). Without it they fail
    loudly instead of being skipped: run_snippet would only answer sandbox_unavailable there."""
    if os.geteuid() != 0:
        pytest.fail("the sandbox tests need root (CI and this machine kind run as root)")


def run(code: str, limits: SandboxLimits = FAST, sandbox: Sandbox | None = None) -> SandboxResult:
    return asyncio.run((sandbox or Sandbox(uids=UIDS)).run(code, limits=limits))


def sandbox_processes() -> list[int]:
    """Pids on the machine owned by one of this module's sandbox uids."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
        except (OSError, ValueError):
            continue
        uid_line = next((line for line in status.splitlines() if line.startswith("Uid:")), "")
        if uid_line and int(uid_line.split()[1]) in UIDS:
            found.append(int(entry.name))
    return found


def test_mechanism_is_active_here():
    code = """
import json, os, socket
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "pid": os.getpid(),
    "interfaces": [n for _, n in socket.if_nameindex()], "root_ro": bool(os.statvfs("/").f_flag & os.ST_RDONLY),
    "tmp": sorted(os.listdir("/tmp")), "cwd": os.getcwd(), "pids": sorted(int(p) for p in os.listdir("/proc")
    if p.isdigit()), "repo": os.listdir(REPO) if os.path.isdir(REPO) else None}))
""".replace("REPO", repr(str(REPO_ROOT)))
    result = run(code)
    assert result.ok, result
    seen = json.loads(result.stdout)
    assert seen["uid"] in UIDS and seen["gid"] == seen["uid"] and seen["groups"] == []
    assert seen["pid"] == 1 and seen["pids"] == [1]  # its own PID namespace, its own /proc
    assert seen["interfaces"] == ["lo"]  # its own network namespace
    assert seen["root_ro"] is True
    assert seen["tmp"] == ["work"] and seen["cwd"] == "/tmp/work"
    assert seen["repo"] == []  # the repository is covered by an empty tmpfs


def test_normal_snippet_prints():
    result = run("print('hello', 6 * 7)")
    assert (result.ok, result.stdout, result.exit_code, result.error) == (True, "hello 42\n", 0, None)
    assert 0 < result.wall_s < 10  # generous: the machine is shared


def test_fork_bomb_is_contained():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    started = time.monotonic()
    result = run(code, SandboxLimits(cpu_s=1, wall_s=2.0, processes=8))
    assert time.monotonic() - started < 15  # wall limit 2 s, plus the kill and a loaded machine
    assert not result.ok and result.error in ("timeout", "killed"), result
    assert sandbox_processes() == []  # the whole tree died with the namespace


def test_huge_output_is_cut_and_reported():
    result = run("import sys\nwhile True:\n    sys.stdout.write('x' * 4096)\n", SandboxLimits(output_bytes=8192))
    assert not result.ok and result.error == "output_limit", result
    assert result.stdout == "x" * 8192 and result.wall_s < 3


def test_infinite_loop_hits_the_cpu_limit():
    # A generous wall limit: on a loaded machine (load 20 on 2 cores seen) 1 s of CPU takes many seconds of wall.
    result = run("while True:\n    pass\n", SandboxLimits(cpu_s=1, wall_s=25.0))
    assert not result.ok and result.error == "timeout" and "CPU" in result.detail, result
    assert result.cpu_s >= 0.8 and result.wall_s < 25


def test_sleeping_loop_hits_the_wall_timeout():
    result = run("import time\nwhile True:\n    time.sleep(1)\n", SandboxLimits(cpu_s=5, wall_s=1.0))
    assert not result.ok and result.error == "timeout" and "wall" in result.detail, result
    assert 1.0 <= result.wall_s < 4


@pytest.mark.parametrize("code", ["x = bytearray(1 << 30)", "xs = []\nwhile True:\n    xs.append(bytearray(1 << 20))"])
def test_memory_hog_hits_the_limit(code):
    result = run(code, SandboxLimits(memory_bytes=128 * 1024 * 1024))
    assert not result.ok and result.error == "memory", result


def test_writes_outside_its_directory_fail():
    name = f"sandbox-escape-{os.getpid()}"
    targets = [REPO_ROOT / name, Path("/tmp") / name, Path.home() / name, Path("/var/tmp") / name, Path("/") / name]
    code = f"""
import json
out = {{}}
for path in {[str(t) for t in targets] + ["inside.txt"]!r}:
    try:
        with open(path, "w") as f:
            f.write("escaped")
        out[path] = "written"
    except OSError as exc:
        out[path] = type(exc).__name__
print(json.dumps(out))
"""
    result = run(code)
    assert result.ok, result
    out = json.loads(result.stdout)
    assert out.pop("inside.txt") == "written"  # its own directory is writable
    assert "written" not in out.values(), out
    for target in targets:
        assert not target.exists()


def test_sockets_reach_nothing():
    with socket.socket() as listener, tempfile.TemporaryDirectory() as folder:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        unix_path = os.path.join(folder, "open.sock")
        unix = socket.socket(socket.AF_UNIX)
        unix.bind(unix_path)
        unix.listen(8)
        os.chmod(folder, 0o755)
        os.chmod(unix_path, 0o777)
        code = f"""
import socket
for family, address in ((socket.AF_INET, ("127.0.0.1", {listener.getsockname()[1]})),
                        (socket.AF_INET, ("1.1.1.1", 53)), (socket.AF_UNIX, {unix_path!r})):
    s = socket.socket(family)
    s.settimeout(1)
    try:
        s.connect(address)
        print("connected", address)
    except OSError as exc:
        print("refused", type(exc).__name__)
"""
        result = run(code)
        with pytest.raises(BlockingIOError):
            listener.accept()
        unix.close()
    assert result.ok, result
    assert result.stdout.count("refused") == 3 and "connected" not in result.stdout, result.stdout


def test_env_holds_none_of_the_parents(monkeypatch):
    monkeypatch.setenv("AGENTS_SANDBOX_TEST_SECRET", "s3cret-value")
    result = run("import json, os\nprint(json.dumps(dict(os.environ)))")
    assert result.ok, result
    env = json.loads(result.stdout)
    assert "AGENTS_SANDBOX_TEST_SECRET" not in env and "s3cret-value" not in result.stdout
    assert set(env) <= {"LC_CTYPE"}  # Python's own locale coercion (PEP 538), nothing inherited


def test_temp_dir_is_removed_afterwards(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    async def during_and_after():
        task = asyncio.ensure_future(Sandbox(uids=UIDS).run("import time\ntime.sleep(0.5)", limits=FAST))
        await asyncio.sleep(0.2)
        during = os.listdir(tmp_path)
        return during, await task

    during, result = asyncio.run(during_and_after())
    assert result.ok, result
    assert len(during) == 1 and during[0].startswith("agents-sandbox-")
    assert os.listdir(tmp_path) == []


def test_eight_concurrent_snippets_all_return_within_the_bound():
    sandbox = Sandbox(max_concurrent=4, uids=UIDS)

    async def all_of_them():
        code = "import time\ntime.sleep(0.5)\nprint({})"
        return await asyncio.gather(*(sandbox.run(code.format(i), limits=FAST) for i in range(8)))

    started = time.monotonic()
    results = asyncio.run(all_of_them())
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)] and all(r.ok for r in results)
    assert time.monotonic() - started >= 1.0  # at most 4 at once: two waves of 0.5 s


def test_refusals_are_results_not_exceptions():
    assert run("print(1)", sandbox=Sandbox(uids=UIDS, python="/nonexistent/python3")).error == "sandbox_unavailable"
    assert asyncio.run(Sandbox(uids=UIDS).run("1", language="bash")).error == "unsupported_language"
    assert run("#" * (MAX_CODE_BYTES + 1)).error == "code_too_large"
    crashed = run("raise SystemExit(3)")
    assert (crashed.ok, crashed.error, crashed.exit_code) == (False, "exit_code", 3)
    with pytest.raises(ValueError, match="SandboxLimits.cpu_s"):
        SandboxLimits(cpu_s=0)
    with pytest.raises(ValueError, match="Sandbox.max_concurrent"):
        Sandbox(max_concurrent=0)
