"""Learning benchmark: the default config (digits task) from random init; greedy exact-match over wall time.

Writes bench/results/learning.json: threshold, seconds_to_threshold, final and held-out exact-match, the curve,
the baseline (a greedy evaluation of version 0, the run's initial weights, before any training step; the same
prompts the run's evaluations use), and the machine load while it ran.
Usage: python bench/learning.py [--quick] [--budget-s 600] [--mode colocated|local|disaggregated] [--out PATH]
       python bench/learning.py --smoke --out PATH   (2 small steps, each evaluated on a few prompts: checks it
                                                      runs; on the Ray cluster at RAY_ADDRESS when set)
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
from trainer.evaluate import eval_prompts, evaluate  # noqa: E402
from trainer.learner import Learner  # noqa: E402
from trainer.loop import TrainingRun  # noqa: E402
from trainer.problems import task_build  # noqa: E402
from trainer.sinks import EventEmitter  # noqa: E402

OUT = ROOT / "bench" / "results" / "learning.json"


class CurveSink:
    stop_requested = False

    def __init__(self) -> None:
        self.curve: list[dict] = []
        self.loads: list[float] = []
        self.t0 = time.monotonic()

    def write(self, event: dict) -> None:
        if event["type"] != "train":
            return
        d = event["data"]
        self.loads.append(os.getloadavg()[0])
        point = {
            "step": d["step"],
            "seconds": round(d["elapsed_s"], 2),
            "reward": d["reward_mean"],
            "exact_match": d.get("train_exact_match"),
            "held_out_exact_match": d.get("held_out_exact_match"),
            "sampled_exact_match": d["exact_match"],
            "filtered_rate": d["filtered_rate"],
            "entropy": d["entropy"],
        }
        self.curve.append(point)
        if point["exact_match"] is not None:
            print(
                f"step {d['step']:4d} {d['elapsed_s']:6.0f}s reward {d['reward_mean']:.3f} "
                f"greedy_em {point['exact_match']:.3f} held_out {point['held_out_exact_match']:.3f} "
                f"filtered {d['filtered_rate']:.2f} load {self.loads[-1]:.1f}",
                flush=True,
            )

    def close(self, timeout_s: float = 0) -> None:
        pass


def version_0_baseline(cfg: TrainConfig) -> dict[str, float]:
    """Greedy exact-match of version 0: the learner's initial weights (seeded by cfg.seed, as the run's learner
    and engines build them), evaluated before any training step on the run's evaluation prompts."""
    learner, task = Learner(cfg), task_build(cfg)
    train = evaluate(learner.model, task, eval_prompts(task.train_prompts, cfg.eval_prompts))
    held = evaluate(learner.model, task, eval_prompts(task.held_out_prompts, cfg.eval_prompts))
    return {"exact_match": train["exact_match"], "held_out_exact_match": held["exact_match"], "version": 0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny budget: checks the bench runs, not learning")
    ap.add_argument("--budget-s", type=float, default=600.0)
    ap.add_argument("--mode", default=None)
    ap.add_argument("--smoke", action="store_true", help="2 small steps: checks it runs (needs --out)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.smoke and args.out.resolve().is_relative_to(OUT.parent):
        ap.error("--smoke needs an --out outside bench/results/ (those files hold real measurements)")
    threshold = 0.5
    cfg = TrainConfig()
    changes: dict = {"time_limit_s": 60.0 if args.quick else args.budget_s, "eval_every": 5}
    if args.mode:
        changes["mode"] = args.mode
    if args.quick:
        changes.update(prompts_per_step=32, steps=20)
    if args.smoke:
        changes.update(prompts_per_step=8, steps=2, eval_every=1, eval_prompts=16, time_limit_s=120.0)
    cfg = cfg.replace(**changes)
    baseline = version_0_baseline(cfg)
    sink = CurveSink()
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    result = TrainingRun(cfg, emitter=EventEmitter([sink])).run()
    evaluated = [p for p in sink.curve if p["exact_match"] is not None]
    reached = next((p for p in evaluated if p["exact_match"] >= threshold), None)
    last = evaluated[-1] if evaluated else {}
    out = {
        "threshold": threshold,
        "seconds_to_threshold": reached["seconds"] if reached else None,
        "final_exact_match": last.get("exact_match"),
        "held_out_exact_match": last.get("held_out_exact_match"),
        "best_held_out_exact_match": max((p["held_out_exact_match"] for p in evaluated), default=None),
        "baseline_exact_match": baseline["exact_match"],
        "baseline": baseline,
        "steps": result.version,
        "curve": sink.curve,
        "config": cfg.to_dict(),
        "machine": {
            "cpus": os.cpu_count(),
            "uptime_before": uptime_before,
            "uptime_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
            "load_1m_mean": sum(sink.loads) / max(1, len(sink.loads)),
            "gpu": False,
        },
        "quick": args.quick,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(
        json.dumps(
            {
                k: out[k]
                for k in ("threshold", "seconds_to_threshold", "final_exact_match", "held_out_exact_match", "steps")
            }
        )
    )


if __name__ == "__main__":
    main()
