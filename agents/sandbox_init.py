"""The sandbox's launcher: run as root by `agents.sandbox_process`, it confines one snippet and execs it, or refuses.

Started as `<sandbox python> -I -S -B sandbox_init.py <config JSON>` (the interpreter the snippet gets too, so
nothing it imports late sits under a hidden path) with an empty environment, in its own session. It
owns every privileged step, in this order, and any step that fails ends it before user code runs (a JSON line
`{"error": ...}` on the status pipe, exit 125: the caller answers "sandbox_unavailable", never runs unconfined):

1. new mount, network, PID, IPC and UTS namespaces (`unshare(2)` through libc; the network has only a down `lo`);
2. mounts made private; /tmp, /run, /home, /root, /var/tmp, /dev/shm and the given paths (the repository) are
   covered by empty tmpfs; the snippet's working directory /tmp/work is a tmpfs of `disk_bytes`, owned by the
   sandbox uid, holding `snippet.py`; every other mount is remounted read-only and nosuid;
3. fork: the child is PID 1 of the new PID namespace (when it exits, the kernel kills everything it started);
   it mounts a fresh /proc, sets the rlimits, drops to the dedicated uid/gid with no groups, checks that it
   cannot become root again, that it is PID 1, that the network has nothing but `lo` and / is read-only, asks
   for SIGKILL when the launcher dies, and execs `python -I -S -B snippet.py` with an empty environment;
4. the launcher reports the child's pid, waits for it and reports its wait status and CPU seconds.

Stdlib only; the status pipe's fd is in the config.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import signal
import socket
import sys
from typing import Any

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_NOATIME, MS_NODIRATIME, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 16384, 1 << 18, 1 << 21
PR_SET_PDEATHSIG = 1
ALWAYS_HIDDEN = ("/tmp", "/var/tmp", "/run", "/dev/shm", "/home", "/root")
WORKDIR = "/tmp/work"
MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME}
MOUNT_FLAGS |= {"nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """A confinement step failed: nothing of the snippet runs."""


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)} (errno {errno})")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _mount_points() -> list[tuple[str, int]]:
    """(mount point, flags to keep) for every mount, from /proc/self/mountinfo (octal escapes decoded)."""
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            path = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            keep = 0
            for option in fields[5].split(","):
                keep |= MOUNT_FLAGS.get(option, 0)
            points.append((path, keep))
    return points


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def confine_filesystem(config: dict[str, Any], code: bytes) -> None:
    """Step 2: hide the writable and private places, give the snippet its own small tmpfs, the rest read-only."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    hidden = [p for p in dict.fromkeys([*ALWAYS_HIDDEN, *config["hide"]]) if os.path.isdir(p)]
    for path in hidden:
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=755")
    os.makedirs(WORKDIR, mode=0o755)
    uid, gid = config["uid"], config["gid"]
    _mount("tmpfs", WORKDIR, "tmpfs", MS_NOSUID | MS_NODEV, f"size={config['disk_bytes']},mode=700,uid={uid},gid={gid}")
    snippet = os.path.join(WORKDIR, "snippet.py")
    with open(snippet, "wb") as f:
        f.write(code)
    os.chown(snippet, uid, gid)
    for path, keep in _mount_points():
        if path == WORKDIR:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | keep
        if _libc.mount(None, path.encode(), None, ctypes.c_ulong(flags), None) != 0:
            # A mount under a hidden path is no longer reachable (its path now names the empty tmpfs).
            if not _under(path, hidden):
                _check(-1, f"remount read-only {path}")


def drop_and_check(config: dict[str, Any]) -> None:
    """Step 3 in the child, before user code: rlimits, the dedicated uid, and the checks that it all took."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(WORKDIR)
    limits = config["rlimits"]
    for name, value in (
        ("RLIMIT_CORE", 0),
        ("RLIMIT_CPU", limits["cpu"]),
        ("RLIMIT_AS", limits["as"]),
        ("RLIMIT_FSIZE", limits["fsize"]),
        ("RLIMIT_NPROC", limits["nproc"]),
        ("RLIMIT_NOFILE", limits["nofile"]),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))
    os.setgroups([])
    os.setgid(config["gid"])
    os.setuid(config["uid"])
    if os.getuid() == 0 or os.geteuid() == 0 or os.getgid() == 0 or os.getgroups():
        raise SetupError("still root after dropping privileges")
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise SetupError("could become root again")
    if os.getpid() != 1:
        raise SetupError(f"not PID 1 of a new PID namespace (pid {os.getpid()})")
    interfaces = [name for _, name in socket.if_nameindex()]
    if interfaces != ["lo"]:
        raise SetupError(f"network namespace has interfaces {interfaces}")
    if not os.statvfs("/").f_flag & os.ST_RDONLY:
        raise SetupError("/ is writable")
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def child(config: dict[str, Any], status_fd: int, lifeline: int) -> None:
    try:
        drop_and_check(config)
        os.set_blocking(lifeline, False)
        try:
            if os.read(lifeline, 1) == b"":
                raise SetupError("launcher died before exec")
        except BlockingIOError:
            pass  # the launcher holds the write end: alive
        os.close(lifeline)
        os.set_inheritable(status_fd, False)
        os.execve(config["python"], [config["python"], "-I", "-S", "-B", "snippet.py"], {})
    except Exception as exc:  # nothing of the snippet ran
        os.write(status_fd, (json.dumps({"error": f"sandbox child: {type(exc).__name__}: {exc}"}) + "\n").encode())
    os._exit(125)


def main() -> int:
    config = json.loads(sys.argv[1])
    status_fd = config["status_fd"]

    def report(message: dict[str, Any]) -> None:
        os.write(status_fd, (json.dumps(message) + "\n").encode())

    try:
        if os.geteuid() != 0:
            raise SetupError("the launcher must run as root (namespaces, mounts, a separate uid)")
        with open(config["code_path"], "rb") as f:
            code = f.read()
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        _check(_libc.unshare(ctypes.c_int(flags)), "unshare")
        confine_filesystem(config, code)
        life_read, life_write = os.pipe()
        pid = os.fork()
    except Exception as exc:  # any failure before the fork: nothing ran, and the caller must know why
        report({"error": f"sandbox launcher: {type(exc).__name__}: {exc}"})
        return 125
    if pid == 0:
        os.close(life_write)
        child(config, status_fd, life_read)
    os.close(life_read)
    report({"child": pid})
    _, status, usage = os.wait4(pid, 0)
    report({"status": status, "cpu_s": usage.ru_utime + usage.ru_stime})
    return 0


if __name__ == "__main__":
    sys.exit(main())
