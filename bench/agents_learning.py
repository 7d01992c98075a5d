"""Learning through HTTP (issue 24): the digit task in process and through the session server side by side, and
the tool-use environment learning to call its tool. Writes `learning` and `tool_calls` (and `learning_run`, how
they were measured) of bench/results/agents.json and keeps its other keys (bench/agents.py writes `concurrency`
and `proxy`).

    python bench/agents_learning.py [--rounds 2] [--budget-s 600] [--tools-budget-s 600] [--part all|learning|tools]
                                     [--out PATH]
    python bench/agents_learning.py --smoke --out PATH   (2 tiny steps per run, each in local mode, the session
                                                          server included: checks it runs and writes every key)

A bench of its own, not a mode of bench/agents.py: that one measures request throughput in a couple of minutes
(`--quick`) with a platform and a proxy; this one trains real runs for many minutes, and each writes only its own
keys, so one never has to be rerun for the other.

All runs go to ONE Ray head (the first run starts it, or RAY_ADDRESS), one after the other, at the trainer's
defaults (colocated, 2 engines, 2 workers, 128 prompts x 8 per step), so both digit sides get the same batch,
evaluation (greedy on the learner's weights, `eval_every` 5, the same 240 training and 60 held-out problems) and
wall budget. Round r runs both sides at seed r: one seed is one draw of the (a, d) split, the initial weights
and the samples, and the in-process side at seed 0 took 70 steps where seeds 1-3 took 80-110, so a single
seed said more about that draw than about HTTP. They differ only in how an episode reaches the policy:
- in process (`inproc_s`): `TrainConfig()`, the trainer's digit task: a worker sends one engine request per group
  (G rows in lock step) over Ray, 12-token vocabulary, context 16;
- HTTP (`http_s`): `environment="digits"`: a worker opens one session per group on the run's session server and
  the environment asks for the group's G episodes with the official openai client as one request with `n` = G
  choices, the reply kept to the digits with `logit_bias`; the chat vocabulary (101 ids), context 16 (the
  in-process block size; the episode needs 11 positions).
Rounds alternate the order (round 1: in process then HTTP; round 2 reversed, ...). Per side, seconds to greedy
exact-match 0.5 on the training problems (the train event's `elapsed_s` at the first evaluation that reaches it)
as the median over rounds; `ratio` is the median of per-round ratios (HTTP over in-process from the same round,
under the same load), with its spread. A side that does not reach 0.5 within the budget counts as not reached
(null); its round's ratio is then only a lower bound (`ratio_at_least`). Beside it, per side, the steps to 0.5, the
wall seconds per step and the groups run per step (the zero-variance filter drops the rest), which split the
ratio into "more steps", "more groups per step" and "slower groups".

Tool use: `environment="tools"` (8 prompts x 8 per step, 2 minibatches, context 128, lr 3e-3, no evaluation) for
`--tools-budget-s`. The valid-tool-call rate per step is that step's new valid calls over its new episodes (the
workers' counters in the `agents` event: every episode run, filtered or not); `valid_rate_start` is the mean over
the first 3 steps, `valid_rate_end` over the last 5.

Also stored per digit run: CPU seconds per step by role (this process, each kind of Ray actor, Ray's own
processes; /proc, for the Ray head this process started), to say where HTTP's time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Ray starts its worker processes (every actor) at nice 15 by default: on a shared machine the runs would not get
# the priority this process runs at. Only a head this process starts reads it.
os.environ.setdefault("RAY_worker_niceness", "0")

from bench.cpu import cpu_by_role  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.loop import TrainingRun  # noqa: E402
from trainer.sinks import EventEmitter  # noqa: E402

OUT = ROOT / "bench" / "results" / "agents.json"
THRESHOLD = 0.5
START_STEPS, END_STEPS = 3, 5
SIDES = {
    "inproc": {},
    "http": {"environment": "digits", "context_tokens": 16},
}
# A valid call is 2 characters in place from 101 ids (docs/agents.md, "tools"): lr 3e-3, not 1e-3; small steps (8
# prompts, 2 minibatches), so that each character found is trained on before the next step samples again.
TOOLS = {
    "environment": "tools",
    "context_tokens": 128,
    "prompts_per_step": 8,
    "minibatches": 2,
    "eval_every": 0,
    "lr": 0.003,
}


class Events:
    """The train, sampler and agents events of one run, with the 1-minute load average and the CPU seconds by role
    (`cpu_by_role`) at each train event."""

    stop_requested = False

    def __init__(self) -> None:
        self.train: list[dict[str, Any]] = []
        self.agents: list[dict[str, Any]] = []
        self.groups: list[int] = []  # the sampler's global group count after each step
        self.loads: list[float] = []
        self.cpu: list[dict[str, float]] = []  # at each train event
        self.cpu_started: dict[str, float] = {}  # once the run's actors are up (its `worker` started event)

    def write(self, event: dict[str, Any]) -> None:
        kind, data = event["type"], event["data"]
        if kind == "train":
            self.train.append(data)
            self.loads.append(os.getloadavg()[0])
            self.cpu.append(cpu_by_role())
        elif kind == "sampler" and self.train:
            if len(self.groups) < len(self.train):
                self.groups.append(int(data["group_count"]))
        elif kind == "agents":
            self.agents.append(data)
        elif kind == "worker" and data.get("event") == "started":
            self.cpu_started = cpu_by_role()

    def close(self, timeout_s: float = 0) -> None:
        pass


def run(cfg: TrainConfig) -> tuple[Events, float]:
    events = Events()
    t0 = time.monotonic()
    TrainingRun(cfg, emitter=EventEmitter([events])).run()
    return events, time.monotonic() - t0


def digits_run(base: TrainConfig, side: str) -> dict[str, Any]:
    """One digit run to exact-match 0.5 (or the budget): its time, steps and what a step cost."""
    load0 = os.getloadavg()
    events, wall = run(base.replace(**SIDES[side]))
    evaluated = [d for d in events.train if d.get("train_exact_match") is not None]
    reached = next((d for d in evaluated if d["train_exact_match"] >= THRESHOLD), None)
    upto = [d for d in events.train if reached is None or d["step"] <= reached["step"]]
    groups = events.groups[: len(upto)]
    cpu = cpu_per_step(events, len(upto))
    episodes_per_step = groups[-1] / len(groups) * base.group_size if groups else 0
    out = {
        "seconds": round(reached["elapsed_s"], 2) if reached else None,
        "steps": reached["step"] if reached else None,
        "last_step": events.train[-1]["step"] if events.train else 0,
        "last_elapsed_s": round(events.train[-1]["elapsed_s"], 2) if events.train else None,
        "s_per_step": round(upto[-1]["elapsed_s"] / len(upto), 3) if upto else None,
        "groups_per_step": round(groups[-1] / len(groups), 1) if groups else None,
        "first_step_groups": groups[0] if groups else None,
        "first_step_s": round(upto[0]["elapsed_s"], 2) if upto else None,
        "cpu_s_per_step": cpu,
        # every role's CPU over the episodes run (kept or filtered): what one episode costs the machine
        "cpu_ms_per_episode": round(1000 * sum(cpu.values()) / episodes_per_step, 3)
        if cpu and episodes_per_step
        else None,
        "curve": [
            {"step": d["step"], "seconds": round(d["elapsed_s"], 2), "exact_match": d["train_exact_match"]}
            for d in evaluated
        ],
        "wall_s": round(wall, 1),
        "load_average": [round(x, 2) for x in (*load0, *os.getloadavg())],
    }
    print(f"{side}: " + json.dumps({k: v for k, v in out.items() if k != "curve"}), flush=True)
    return out


def cpu_per_step(events: Events, steps: int) -> dict[str, float]:
    """CPU seconds per step by role over the first `steps` steps, counted from when the run's actors were up (their
    start-up left out), evaluations included (they are part of each side's time)."""
    if not steps or not events.cpu_started:
        return {}
    first, last = events.cpu_started, events.cpu[steps - 1]
    return {role: round((last[role] - first.get(role, 0.0)) / steps, 3) for role in sorted(last)}


def median_or_none(values: list[float | None]) -> float | None:
    """The median, a value not reached (None) sorting last: None unless more than half the rounds reached it."""
    reached = sorted(v for v in values if v is not None)
    if reached and len(reached) == len(values):
        return statistics.median(reached)
    k = (len(values) - 1) // 2
    return reached[k] if len(reached) > k else None


def learning(base: TrainConfig, rounds: int) -> dict[str, Any]:
    """The two digit sides in alternating rounds, round r at seed r on both; medians, the paired ratio and its
    spread."""
    per: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for r in range(rounds):
        for side in list(SIDES) if r % 2 == 0 else list(reversed(SIDES)):
            per[side].append({"seed": r, **digits_run(base.replace(seed=r), side)})
    return summarize(per)


def summarize(per: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The `learning` key from every round's runs (also `--recompute`: again from a results file's rounds)."""
    ratios, bounds = [], []
    for h, i in zip(per["http"], per["inproc"]):
        if h["seconds"] is not None and i["seconds"] is not None:
            ratios.append(h["seconds"] / i["seconds"])
        elif i["seconds"] is not None:
            bounds.append(h["last_elapsed_s"] / i["seconds"])  # HTTP did not reach it in this many seconds
    http_s = median_or_none([h["seconds"] for h in per["http"]])
    inproc_s = median_or_none([i["seconds"] for i in per["inproc"]])

    def median_of(side: str, key: str) -> float | None:
        return median_or_none([x[key] for x in per[side]])

    return {
        "http_s": http_s,
        "inproc_s": inproc_s,
        "ratio": statistics.median(ratios) if ratios and not bounds else None,
        "ratio_min": min(ratios, default=None),
        "ratio_max": max(ratios, default=None),
        "ratios": ratios,
        "ratio_at_least": min(bounds) if bounds else None,
        "threshold": THRESHOLD,
        "goal": "ratio <= 1.5",
        "steps": {side: median_of(side, "steps") for side in SIDES},
        "s_per_step": {side: median_of(side, "s_per_step") for side in SIDES},
        "groups_per_step": {side: median_of(side, "groups_per_step") for side in SIDES},
        "rounds": per,
    }


def tool_calls(base: TrainConfig, budget_s: float, smoke: bool = False) -> dict[str, Any]:
    """The tools environment for the budget: the valid-tool-call rate per step, at the start and the end."""
    load0 = os.getloadavg()
    cfg = base.replace(**TOOLS, time_limit_s=budget_s, target_exact_match=0.0)
    events, wall = run(cfg.replace(prompts_per_step=base.prompts_per_step) if smoke else cfg)
    curve, seen = [], {"episodes": 0, "valid_tool_calls": 0, "tool_calls": 0}
    for a, t in zip(events.agents, events.train):
        new = {k: int(a[k]) - seen[k] for k in seen}
        seen = {k: int(a[k]) for k in seen}
        rate = new["valid_tool_calls"] / new["episodes"] if new["episodes"] else None
        curve.append(
            {
                "step": a["step"],
                "seconds": round(t["elapsed_s"], 2),
                "valid_rate": rate,
                "episodes": new["episodes"],
                "reward": t["reward_mean"],
                "reward_parts": a.get("reward_parts", {}),
            }
        )
    rates = [p["valid_rate"] for p in curve if p["valid_rate"] is not None]
    start, end = rates[:START_STEPS], rates[-END_STEPS:]
    over = next((p for p in curve if p["valid_rate"] is not None and p["valid_rate"] > 0.8), None)
    out = {
        "valid_rate_start": sum(start) / len(start) if start else None,
        "valid_rate_end": sum(end) / len(end) if end else None,
        "goal": "valid_rate_start < 0.1 and valid_rate_end > 0.8",
        "start_steps": START_STEPS,
        "end_steps": END_STEPS,
        "steps": curve[-1]["step"] if curve else 0,
        "first_step_over_0_8": over["step"] if over else None,
        "seconds_to_over_0_8": over["seconds"] if over else None,
        "curve": curve,
        "budget_s": budget_s,
        "wall_s": round(wall, 1),
        "load_average": [round(x, 2) for x in (*load0, *os.getloadavg())],
    }
    print("tools: " + json.dumps({k: v for k, v in out.items() if k != "curve"}), flush=True)
    return out


def start_ray(tries: int = 3) -> None:
    """The one Ray head every run of this invocation uses (RAY_ADDRESS's when set). On a loaded machine a head
    may time out starting its agents (raylet `WaitForDashboardAgentPorts`): tried again, a few times."""
    import ray

    for attempt in range(1, tries + 1):
        try:
            ray.init(log_to_driver=False)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for a node that did not start
            ray.shutdown()
            if attempt == tries:
                raise
            print(f"ray.init failed ({exc}); trying again", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=600.0, help="wall budget of each digit run")
    ap.add_argument("--tools-budget-s", type=float, default=600.0, help="wall budget of the tools run")
    ap.add_argument("--part", choices=("all", "learning", "tools"), default="all", help="the other's keys are kept")
    ap.add_argument("--smoke", action="store_true", help="2 tiny steps per run: checks it runs (needs --out)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--recompute", action="store_true", help="`learning` again from --out's stored rounds; no run")
    args = ap.parse_args()
    if args.recompute:
        result = json.loads(args.out.read_text())
        result["learning"] = summarize(result["learning"]["rounds"])
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        return
    if args.smoke and args.out.resolve().is_relative_to(OUT.parent):
        ap.error("--smoke needs an --out outside bench/results/ (those files hold real measurements)")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    rounds = 1 if args.smoke else args.rounds
    base = TrainConfig().replace(eval_every=5, target_exact_match=THRESHOLD, time_limit_s=args.budget_s)
    tools_budget = args.tools_budget_s
    if args.smoke:
        small = {"prompts_per_step": 8, "worker_capacity": 4, "steps": 2, "eval_every": 1, "eval_prompts": 8}
        small["filter_zero_variance"] = False  # a random chat policy rarely varies: a step would need ~100 groups
        small["mode"] = "local"  # one process, no actors to start: seconds, where three Ray runs took minutes
        base, tools_budget = base.replace(**small, time_limit_s=120.0), 120.0
    t0 = time.monotonic()
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    if not args.smoke:
        start_ray()
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    if args.part in ("all", "learning"):
        result["learning"] = learning(base, rounds)
    if args.part in ("all", "tools"):
        result["tool_calls"] = tool_calls(base, tools_budget, smoke=args.smoke)
    info = {
        "command": " ".join(["python", "bench/agents_learning.py", *sys.argv[1:]]),
        "rounds": rounds,
        "budget_s": args.budget_s,
        "tools_budget_s": tools_budget,
        "wall_s": round(time.monotonic() - t0, 1),
        "cpus": os.cpu_count(),
        "nice": os.nice(0),
        "uptime_before": uptime_before,
        "uptime_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "config": {"base": base.to_dict(), "sides": SIDES, "tools": TOOLS},
    }
    parts = ("learning", "tools") if args.part == "all" else (args.part,)
    result["learning_run"] = {**result.get("learning_run", {}), **dict.fromkeys(parts, info)}  # how each was measured
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    keys = ("http_s", "inproc_s", "ratio", "ratio_at_least", "steps", "s_per_step", "groups_per_step")
    if "learning" in result:
        print(json.dumps({"learning": {k: result["learning"][k] for k in keys}}))
    if "tool_calls" in result:
        print(json.dumps({"tool_calls": {k: result["tool_calls"][k] for k in ("valid_rate_start", "valid_rate_end")}}))


if __name__ == "__main__":
    main()
