"""CPU seconds by role of this process and the processes it started (Ray's actors by class), from /proc: what the
benches use to say where a side's time went."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_by_role() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process and of the Ray actors it started, by role (`ray::Engine`
    -> Engine, `ray::RolloutWorker.generate_group` -> RolloutWorker): the processes below this one in /proc, so other
    Ray heads on the machine do not count. Empty on a cluster this process did not start (RAY_ADDRESS)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu, name = {}, {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        parent[int(pid)], cpu[int(pid)], name[int(pid)] = (
            int(fields[1]),
            (int(fields[11]) + int(fields[12])) / tick,
            cmd,
        )
    mine, out = {os.getpid()}, {"driver": cpu.get(os.getpid(), 0.0)}
    changed = True  # a child's pid may be lower than its parent's: grow the set to a fixed point
    while changed:
        changed = False
        for pid, ppid in parent.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                changed = True
    for pid in mine - {os.getpid()}:
        if name[pid].startswith("ray::"):
            role = name[pid].removeprefix("ray::").split(".")[0]
        else:  # Ray's own processes (raylet, GCS, its agents), or another child (a daphne)
            role = "ray_system" if "ray" in name[pid] else "other"
        out[role] = out.get(role, 0.0) + cpu[pid]
    return out
