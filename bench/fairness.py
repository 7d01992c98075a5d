"""Who gets the slots (issue 26's fair-share and bounded-waiting acceptance), played forward in simulated time with
the platform's own decision code (runs/slots/simulate.py: every grant is `runs.slots.grant.plan`, every usage
`runs.slots.fairness.dominant_shares`). Writes bench/results/fairness.json; tests/runs/test_fairness_shares.py
holds its numbers to the acceptance bounds.

- `fair_share`: users A and B submit 40 runs each to a 4-slot `app` class with fair share on, A five seconds
  before B; runs last 50-70 s (seeded). Each owner's share of the grants made while both have runs waiting
  (from B's first submit to the last grant of whichever runs out first), per seed, with weights 1:1 and 2:1 (A
  twice B), and with fair share off (FIFO: A's head start takes the class).
- `waiting`: 4 slots kept full by a stream of priority-40 `app` runs (two a second, 3-5 s each, for 1,300 s)
  while one priority-10 `schedule` run waits from t=30 s: its wait with `max_wait_seconds` 60, with aging (100
  points an hour, cap 40) and with neither (it waits until the stream ends). Passes run at every submit and
  release and every 2 s tick.
- `teams`: a 4-slot `app` class with team quotas 2 + 2 (A in team red, B in team blue). A submits 8 runs at t=0
  (60-130 s each) and borrows all four slots while blue is idle; B submits 4 at t=30. With the quotas, each of
  A's borrowed slots goes back to B as A's runs end, until blue holds its 2; without them (FIFO) B waits behind
  every run A queued first.

Simulated time: seconds of CPU for hours of queue, and the same numbers on every machine.
Usage: python bench/fairness.py [--seeds N] [--out PATH] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runs.slots.policy import policy_effective  # noqa: E402
from runs.slots.resources import Res  # noqa: E402
from runs.slots.simulate import Job, contention_window, shares, simulate  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "fairness.json"
CAPACITY = {"node-1": Res(cpu=64_000, memory=1 << 38)}  # room for every run: only the slot rules bind
A, B = 1, 2
TICK_S = 2.0


def fair_share(*, weights: dict[str, int] | None, on: bool, seed: int, runs: int) -> dict:
    """One trial of the two-user race; A's and B's share of the grants in the contention window."""
    app: dict = {"limit": 4, "fair_share": True} if on else {"limit": 4}
    raw: dict = {"max_total": 4, "interactive_reserve": 0, "classes": {"app": app}}
    if weights:
        raw["user_weights"] = weights
    policy = policy_effective(raw, default_max_total=4)
    rng = random.Random(seed)
    jobs = [Job(i * 0.01, A, "app", rng.uniform(50, 70)) for i in range(runs)]
    jobs += [Job(5.0 + i * 0.01, B, "app", rng.uniform(50, 70)) for i in range(runs)]
    outcomes = simulate(policy, CAPACITY, jobs, tick_s=TICK_S)
    start, end = contention_window(outcomes, [A, B])
    got = shares(outcomes, start=start, end=end)
    return {"seed": seed, "window_s": [round(start, 1), round(end, 1)], "a": got.get(A, 0.0), "b": got.get(B, 0.0)}


def fair_share_cases(seeds: int, runs: int) -> dict:
    cases = {"equal": ({}, True), "weights_2_1": ({str(A): 2}, True), "off": ({}, False)}
    out = {}
    for name, (weights, on) in cases.items():
        trials = [fair_share(weights=weights, on=on, seed=s, runs=runs) for s in range(seeds)]
        a = [t["a"] for t in trials]
        out[name] = {
            "a_share_median": round(statistics.median(a), 3),
            "a_share_min": round(min(a), 3),
            "a_share_max": round(max(a), 3),
            "trials": [{**t, "a": round(t["a"], 3), "b": round(t["b"], 3)} for t in trials],
        }
    out["goal"] = "equal: a and b each 0.5 +- 0.1; weights_2_1: a 0.67 +- 0.1"
    return out


def waiting(schedule: dict, *, stream_s: float) -> dict:
    """The priority-10 run's wait while priority-40 runs keep the slots full."""
    classes = {"app": {"limit": 4, "priority": 40}, "schedule": {"limit": 4, "priority": 10, **schedule}}
    policy = policy_effective({"max_total": 4, "interactive_reserve": 0, "classes": classes}, default_max_total=4)
    rng = random.Random(1)
    jobs = [Job(i * 0.5, A, "app", rng.uniform(3, 5)) for i in range(int(stream_s * 2))]
    jobs.append(Job(30.0, B, "schedule", 4.0))
    outcomes = simulate(policy, CAPACITY, jobs, tick_s=TICK_S)
    low = outcomes[-1]
    assert low.granted is not None  # the stream ends, so it is granted at the latest then
    full = sum(1 for o in outcomes[:-1] if o.job.at <= low.granted and (o.granted is None or o.granted > low.granted))
    return {"settings": schedule, "waited_s": round(low.waited or 0.0, 2), "app_runs_waiting_then": full}


def waiting_cases(stream_s: float) -> dict:
    return {
        "max_wait_60": waiting({"max_wait_seconds": 60}, stream_s=stream_s),
        "aging_100_per_hour_cap_40": waiting({"aging_per_hour": 100, "aging_cap": 40}, stream_s=stream_s),
        "neither": waiting({}, stream_s=stream_s),
        "stream_s": stream_s,
        "tick_s": TICK_S,
        "goal": "max_wait_60: granted within 60 s + one tick; aging: once 10 + aging passes 40 (1,080 s), at the "
        "next release or tick",
    }


def teams(*, quotas: bool) -> dict:
    """When B's runs are granted after A borrowed every slot of the class (team quotas 2 + 2, or none)."""
    app: dict = {"limit": 4, "team_quotas": {"red": 2, "blue": 2}} if quotas else {"limit": 4}
    policy = policy_effective({"max_total": 4, "interactive_reserve": 0, "classes": {"app": app}}, default_max_total=4)
    jobs = [Job(0.0, A, "app", 60.0 + 10 * i) for i in range(8)] + [Job(30.0, B, "app", 200.0) for _ in range(4)]
    outcomes = simulate(policy, CAPACITY, jobs, tick_s=TICK_S, groups={A: ("red",), B: ("blue",)})
    ends = sorted(o.finished for o in outcomes if o.job.owner == A and o.finished is not None)
    return {
        "a_granted_s": [o.granted for o in outcomes if o.job.owner == A],
        "b_granted_s": [o.granted for o in outcomes if o.job.owner == B],
        "a_first_ends_s": ends[:4],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--smoke", action="store_true", help="2 seeds, short stream (needs --out)")
    args = parser.parse_args()
    if args.smoke and args.out.resolve().parent == OUT.parent.resolve():
        parser.error("--smoke needs an --out outside bench/results/ (those files hold real measurements)")
    seeds, runs, stream_s = (2, 12, 120.0) if args.smoke else (args.seeds, 40, 1300.0)
    result = {
        "fair_share": fair_share_cases(seeds, runs),
        "waiting": waiting_cases(stream_s),
        "teams": {
            "quotas_2_2": teams(quotas=True),
            "no_quotas": teams(quotas=False),
            "goal": "with quotas, B's first two runs are granted at the first two ends of A's runs after t=30",
        },
        "command": " ".join(["python", "bench/fairness.py", *sys.argv[1:]]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {
                k: {n: v for n, v in c.items() if n != "trials"}
                for k, c in result["fair_share"].items()
                if isinstance(c, dict)
            },
            indent=1,
        )
    )
    print(json.dumps(result["waiting"], indent=1))
    print(json.dumps(result["teams"], indent=1))


if __name__ == "__main__":
    main()
