"""Async vs sync on the multi-turn agent task with tool latency, side by side in one process and one Ray cluster.

Modes: colocated (generation paused while training; max_staleness 0: the synchronous baseline) and
disaggregated with max_staleness 0, 1, 4. Each run has the same wall budget from the same seed. The modes run
in alternating rounds (round 1: colocated, staleness_0, staleness_1, staleness_4; round 2 in reverse; ...) so
that the machine's load drift hits every mode alike, and each mode reports the MEDIAN over its rounds.
The headline is fixed in advance: `paired_speedup`, the median over rounds of (staleness_1 samples/s / colocated
samples/s) within the same round (the two ran back to back, under the same load), with its spread
(`paired_min`, `paired_max`, every round's ratio in `paired_speedups`). Kept for comparison with older results
only: `speedup` (a ratio of two medians, which may come from different rounds) and `best_speedup` (the best
async mode over colocated: picking the best of several noisy modes after the fact overstates the gain).
Each tool latency (default 50 and 200 ms) is measured on its own, one after the other: its rounds, its modes, its
paired headline. Writes bench/results/async.json, per latency under `tool_latency_ms."<ms>"`: per mode the median
samples/s, seconds to the reward threshold, gate-closed share of wall time, and every round's numbers.
Usage: python bench/async.py [--quick] [--budget-s 90] [--rounds 3] [--tool-latency-s 0.05,0.2] [--modes a,b]
                             [--out PATH]
       python bench/async.py --smoke --out PATH   (colocated and the headline mode, 2 small steps each: checks it
                                                   runs; on the Ray cluster at RAY_ADDRESS when set)
       python bench/async.py --recompute bench/results/async.json   (the summary again from its stored rounds)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import psutil  # noqa: E402

from trainer.config import TrainConfig  # noqa: E402
from trainer.loop import TrainingRun  # noqa: E402
from trainer.sinks import EventEmitter  # noqa: E402

OUT = ROOT / "bench" / "results" / "async.json"
HEADLINE = "staleness_1"  # the async mode the headline ratio uses, chosen before measuring
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
    ap.add_argument("--tool-latency-s", default="0.05,0.2", help="comma-separated tool latencies, in seconds")
    ap.add_argument("--threshold", type=float, default=0.4, help="sampled training reward to reach")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset (colocated and the headline stay)")
    ap.add_argument("--smoke", action="store_true", help="2 small steps per mode: checks it runs (needs --out)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--recompute", metavar="PATH", help="recompute the headline of a results file, run nothing")
    args = ap.parse_args()
    if args.smoke and args.out.resolve().is_relative_to(OUT.parent):
        ap.error("--smoke needs an --out outside bench/results/ (those files hold real measurements)")
    if args.recompute:
        out = json.loads(Path(args.recompute).read_text())
        for part in out["tool_latency_ms"].values():
            part.update(paired(part["modes"]))
        Path(args.recompute).write_text(json.dumps(out, indent=1) + "\n")
        print(json.dumps(headlines(out)))
        return
    latencies = [float(x) for x in args.tool_latency_s.split(",")]
    if any(not 0 <= x <= 10 for x in latencies):
        ap.error("--tool-latency-s: each latency must be within [0, 10] seconds")
    latencies = latencies[-1:] if args.smoke else latencies  # smoke: one latency shows the file's shape
    budget = 60.0 if args.smoke else 20.0 if args.quick else args.budget_s  # smoke: a bound, its steps end it
    rounds = 1 if args.quick or args.smoke else max(1, args.rounds)
    names = [m for m in MODES if m in {"colocated", HEADLINE, *([] if args.smoke else args.modes.split(","))}]
    base = TrainConfig().replace(
        task="agent",
        prompts_per_step=32,
        worker_capacity=16,
        steps=10_000,
        eval_every=0,
        time_limit_s=budget,
    )
    if args.smoke:
        base = base.replace(prompts_per_step=8, worker_capacity=4, steps=2)
    out = {
        "headline": "paired_speedup",
        "headline_mode": HEADLINE,
        "tool_latency_ms": {
            str(round(latency * 1000)): measure(base.replace(tool_latency_s=latency), names, rounds, args.threshold)
            for latency in latencies
        },
        "statistic": "median over rounds",
        "threshold": args.threshold,
        "random_policy": {"reward": 1 / base.modulus, "success_rate": (1 / base.modulus) ** base.answer_terms},
        "budget_s": budget,
        "config": {**base.to_dict(), "tool_latency_s": None},  # the latency is each part's own
        "quick": args.quick,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(headlines(out)))


def measure(base: TrainConfig, names: list[str], rounds: int, threshold: float) -> dict:
    """One tool latency: the modes in alternating rounds, each mode's medians, the paired headline."""
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            runs[name].append(run_mode(base, name, threshold))
            print(f"{base.tool_latency_s * 1000:.0f} ms round {r + 1} {name}", json.dumps(runs[name][-1]), flush=True)
    modes = {name: summarize(name, rs) for name, rs in runs.items()}
    base_rate = modes["colocated"]["samples_per_s"]
    best = max(modes[m]["samples_per_s"] for m in names if m != "colocated")
    return {
        "modes": modes,
        **paired(modes),
        "speedup": modes[HEADLINE]["samples_per_s"] / base_rate if base_rate else None,
        "best_speedup": best / base_rate if base_rate else None,
        "tool_latency_s": base.tool_latency_s,
        "rounds": rounds,
        "machine": {
            "cpus": os.cpu_count(),
            "gpu": False,
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        },
    }


def headlines(out: dict) -> dict:
    """Per latency: the paired headline and its spread."""
    keys = ("paired_speedup", "paired_min", "paired_max")
    return {ms: {k: part[k] for k in keys} for ms, part in out["tool_latency_ms"].items()}


def paired(modes: dict) -> dict:
    """The headline: per round, the headline mode's samples/s over colocated's from the same round; the median
    of those ratios and their spread."""
    pairs = zip(modes["colocated"]["rounds"], modes[HEADLINE]["rounds"])
    ratios = [h["samples_per_s"] / c["samples_per_s"] for c, h in pairs if c["samples_per_s"]]
    return {
        "paired_speedup": statistics.median(ratios) if ratios else None,
        "paired_min": min(ratios, default=None),
        "paired_max": max(ratios, default=None),
        "paired_speedups": ratios,
    }


def run_mode(base: TrainConfig, name: str, threshold: float) -> dict:
    """One run of one mode for the wall budget: its samples/s, time to the threshold, gate-closed share."""
    mode, staleness = MODES[name]
    cfg = base.replace(mode=mode, max_staleness=staleness)
    sink = TrainEvents()
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    with CpuMeter() as cpu:
        TrainingRun(cfg, emitter=EventEmitter([sink])).run()
    wall = time.monotonic() - t0
    last = sink.train[-1]
    reached = next((d["elapsed_s"] for d in sink.train if d["reward_mean"] >= threshold), None)
    return {
        "samples_per_s": last["samples_per_s"],
        "seconds_to_threshold": reached,
        "gate_closed_share": last["gate_closed_share"],
        "steps": last["step"],
        "final_reward": last["reward_mean"],
        "final_success_rate": sum(d["exact_match"] for d in sink.train[-5:]) / len(sink.train[-5:]),
        "staleness_max": max(d["staleness_max"] for d in sink.train),
        # Where the time goes: the share of the run's wall time the learner spent in train steps (1 - this: the
        # learner waiting for groups; with the gate-closed share, generation waiting for the learner).
        "learner_busy_share": sum(d["train_seconds"] for d in sink.train) / last["elapsed_s"],
        # CPU seconds of this process and all its descendants (the Ray cluster's workers and actors) over the
        # wall time times the machine's cores: 1.0, every core busy with this run for the whole run.
        "cpu_share": cpu.seconds / (wall * (os.cpu_count() or 1)),
        "wall_s": round(wall, 1),
        "load_1m": [round(load0, 1), round(os.getloadavg()[0], 1)],
    }


class CpuMeter:
    """CPU time used by this process and its descendants while the block runs, sampled every 0.2 s per process
    (a process that ends between two samples loses at most its last 0.2 s)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, float], float] = {}  # (pid, create time) -> CPU seconds at the last sample
        self.start: dict[tuple[int, float], float] = {}
        self.done = threading.Event()

    def sample(self) -> None:
        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:
            try:
                key, times = (proc.pid, proc.create_time()), proc.cpu_times()
            except psutil.Error:
                continue
            self.seen[key] = times.user + times.system
            self.start.setdefault(key, 0.0 if self.started else self.seen[key])

    def __enter__(self) -> CpuMeter:
        self.started = False
        self.sample()
        self.started = True
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()
        return self

    def loop(self) -> None:
        while not self.done.wait(0.2):
            self.sample()

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self.sample()
        self.seconds = sum(self.seen[key] - self.start[key] for key in self.seen)


def summarize(name: str, rounds: list[dict]) -> dict:
    """A mode's medians over its rounds (a threshold never reached counts as not reached), plus every round."""

    def median(key: str) -> float | None:
        values = [r[key] for r in rounds]
        if any(v is None for v in values):
            reached = sorted(v for v in values if v is not None)
            # Not reached sorts last: the median is None unless more than half of the rounds reached it.
            return reached[(len(values) - 1) // 2] if len(reached) > (len(values) - 1) // 2 else None
        return statistics.median(values)

    mode, staleness = MODES[name]
    keys = ("samples_per_s", "seconds_to_threshold", "gate_closed_share", "steps", "final_reward")
    keys += ("learner_busy_share", "cpu_share")
    return {
        **{key: median(key) for key in keys},
        "final_success_rate": statistics.median(r["final_success_rate"] for r in rounds),
        "staleness_max": max(r["staleness_max"] for r in rounds),
        "mode": mode,
        "max_staleness": staleness,
        "wall_s": round(sum(r["wall_s"] for r in rounds), 1),
        "load_1m": [r["load_1m"] for r in rounds],
        "rounds": rounds,
    }


if __name__ == "__main__":
    main()
