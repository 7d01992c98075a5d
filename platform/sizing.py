"""The embedded default slot total: how many runs of the default config fit the Ray cluster at once.

Run as a script by up.py once the Ray head answers (`python platform/sizing.py` with RAY_ADDRESS and the Ray
auth variables in its environment); prints one JSON line: `{"max_total", "nodes", "total", "per_run"}`. The fit
is the admission's own rule (runs.slots.resources.pack: every bundle of a run placed, or none) applied to the
default TrainConfig's bundles (trainer.resources) over the alive nodes' totals, repeated until the next run
would not fit; at least 1, so the platform always admits something.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runs.slots.resources import Res, pack, total  # noqa: E402 - pure modules, after the repo is on the path
from trainer.config import TrainConfig  # noqa: E402
from trainer.resources import run_bundles  # noqa: E402

MAX_TOTAL_CEILING = 1000  # the slot policy's own maximum


def runs_that_fit(nodes: dict[str, Res], bundles: list[Res]) -> int:
    """How many copies of a run fit the nodes at once (each copy packed whole into what the others left)."""
    free, count = dict(nodes), 0
    while count < MAX_TOTAL_CEILING:
        placement = pack(bundles, free)
        if placement is None:
            break
        for bundle, node in zip(bundles, placement):
            free[node] = free[node] - bundle
        count += 1
    return count


def alive_nodes(address: str, wait_s: float) -> dict[str, Res]:
    """Alive nodes' total resources, read through the Ray dashboard (retried while the head starts)."""
    from ray.util.state import list_nodes

    deadline = time.monotonic() + wait_s
    while True:
        try:
            found = {
                n.node_id: Res.from_json(n.resources_total or {})
                for n in list_nodes(address=address, detail=True)
                if n.state == "ALIVE"
            }
            if found:
                return found
        except Exception:  # noqa: BLE001 - the head is still starting; give up only at the deadline
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"no alive Ray node at {address} after {wait_s:.0f} s")
        time.sleep(1.0)


def main() -> int:
    nodes = alive_nodes(os.environ["RAY_ADDRESS"], float(os.environ.get("SIZING_WAIT_SECONDS", "120")))
    per_run = [Res.from_json(b.to_json()) for b in run_bundles(TrainConfig())]
    fit = runs_that_fit(nodes, per_run)
    max_total = max(1, fit)
    out = {
        "max_total": max_total,
        # Fewer than 4 slots: the default reserve (max(1, max_total // 4)) would keep half or all of them for the
        # dashboard and leave API runs one slot on a machine that fits two; a single-user embedded platform
        # shares them instead (staff can still set a reserve on the settings page).
        "interactive_reserve": 0 if max_total < 4 else None,
        "fits": fit,
        "nodes": len(nodes),
        "total": total(list(nodes.values())).to_json(),
        "per_run": total(per_run).to_json(),
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
