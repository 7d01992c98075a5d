"""Async vs sync on the multi-turn agent task with tool latency, side by side in one process and one Ray cluster.

Modes: colocated (generation paused while training; max_staleness 0: the synchronous baseline) and
disaggregated with max_staleness 0, 1, 4. Each runs for the same wall budget from the same seed.
Writes bench/results/async.json: per mode samples/s, seconds to the reward threshold and gate-closed share
of wall time, and best_speedup = best async samples/s / colocated samples/s.
Usage: python bench/async.py [--quick] [--budget-s 90] [--tool-latency-s 0.2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from trainer.config import TrainConfig  # noqa: E402
from trainer.loop import TrainingRun  # noqa: E402
from trainer.sinks import EventEmitter  # noqa: E402

MODES = {
    "colocated": ("colocated", 0),
    "staleness_0": ("disaggregated", 0),
    "staleness_1": ("disaggregated", 1),
    "staleness_4": ("disaggregated", 4),
}


class TrainEvents:
    stop_requested = False

    def __init__(self) -> None:
        self.train: list[dict] = []

    def write(self, event: dict) -> None:
        if event["type"] == "train":
            self.train.append(event["data"])

    def close(self, timeout_s: float = 0) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=90.0)
    ap.add_argument("--tool-latency-s", type=float, default=0.2)
    ap.add_argument("--threshold", type=float, default=0.4, help="sampled training reward to reach")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "async.json"))
    args = ap.parse_args()
    budget = 20.0 if args.quick else args.budget_s
    base = TrainConfig().replace(
        task="agent",
        tool_latency_s=args.tool_latency_s,
        prompts_per_step=32,
        worker_capacity=16,
        steps=10_000,
        eval_every=0,
        time_limit_s=budget,
    )
    modes: dict[str, dict] = {}
    for name, (mode, staleness) in MODES.items():
        cfg = base.replace(mode=mode, max_staleness=staleness)
        sink = TrainEvents()
        load0 = os.getloadavg()[0]
        t0 = time.monotonic()
        TrainingRun(cfg, emitter=EventEmitter([sink])).run()
        wall = time.monotonic() - t0
        last = sink.train[-1]
        reached = next((d["elapsed_s"] for d in sink.train if d["reward_mean"] >= args.threshold), None)
        modes[name] = {
            "samples_per_s": last["samples_per_s"],
            "seconds_to_threshold": reached,
            "gate_closed_share": last["gate_closed_share"],
            "steps": last["step"],
            "final_reward": last["reward_mean"],
            "final_success_rate": sum(d["exact_match"] for d in sink.train[-5:]) / len(sink.train[-5:]),
            "staleness_max": max(d["staleness_max"] for d in sink.train),
            "mode": mode,
            "max_staleness": staleness,
            "wall_s": round(wall, 1),
            "load_1m": [round(load0, 1), round(os.getloadavg()[0], 1)],
        }
        print(name, json.dumps(modes[name]), flush=True)
    base_rate = modes["colocated"]["samples_per_s"]
    best = max(modes[m]["samples_per_s"] for m in ("staleness_0", "staleness_1", "staleness_4"))
    out = {
        "modes": modes,
        "best_speedup": best / base_rate if base_rate else None,
        "threshold": args.threshold,
        "random_policy": {"reward": 1 / base.modulus, "success_rate": (1 / base.modulus) ** base.answer_terms},
        "budget_s": budget,
        "tool_latency_s": args.tool_latency_s,
        "config": base.to_dict(),
        "quick": args.quick,
        "machine": {
            "cpus": os.cpu_count(),
            "gpu": False,
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"best_speedup": out["best_speedup"]}))


if __name__ == "__main__":
    main()
