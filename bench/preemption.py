"""Lossless preemption, repeated: the end-to-end test tests/execution/test_preempt_live.py run with
`PREEMPT_TRIALS` trials (default 10) against one control run, on the suite's services (PostgreSQL at
DATABASE_URL, Redis at REDIS_URL, a Ray head of the test session's own). Each trial preempts a fresh victim for an
interactive run and asserts what issue 26 asks (one victim, checkpointed within the grace period, the interactive
run running within grace + 30 s, the victim at position 1 of its class, resumed at checkpoint step + 1, the same
sampler groups as the control run); it records the checkpoint step, the last step trained before the stop, the
first step after the resume, the steps lost, the stop's seconds and the interactive run's seconds to running,
and the file is written after every trial (a stopped bench keeps the trials it finished), with a summary.

    python bench/preemption.py [--trials N] [--out PATH]   (default bench/results/preemption.json)

Not in the smoke set of tests/test_bench_smoke.py: one trial is a full live run (minutes); the suite runs that
one trial as the test itself.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/execution/test_preempt_live.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "preemption.json")
    args = parser.parse_args()
    env = {**os.environ, "PREEMPT_TRIALS": str(args.trials), "PREEMPT_OUT": str(args.out.resolve())}
    args.out.unlink(missing_ok=True)  # what it holds afterwards is this run's trials, none older
    # The test sizes its own timeout from PREEMPT_TRIALS (the suite's 600 s is for less than one trial here).
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", TEST], cwd=ROOT, env=env)
    if args.out.exists():
        print(json.dumps(json.loads(args.out.read_text())["summary"]))
    if done.returncode != 0:
        print(
            f"a preemption trial failed (exit {done.returncode}); {args.out} holds the trials before it",
            file=sys.stderr,
        )
        return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
