"""Sample inspector benchmark: filter latency over 100,000 stored samples, and what capture costs a step.

filter:  100,000 samples of one run, posted through the real ingest view (validated, stored in PostgreSQL),
         then GET /api/runs/<id>/samples/?reward_lte=0&finish_reason=length&staleness_gte=1 through the real
         API (URL routing, session auth, DRF, the keyset paginator) for its first 50 rows, many times: p95.
         Baseline in the same run: the unfiltered first page (`ratio_to_unfiltered`).
capture: the trainer in `local` mode (one process, torch pinned to one thread; every event written as JSON
         lines), CPU time of the process (time.process_time). A/B inside one run: capture on (the defaults: 2
         drawn groups plus best and worst) on even steps, off (samples_groups_per_step=0,
         samples_best_worst=false) on odd ones; capture runs in the step's report phase, so
         capture_overhead = (median report on - median report off) / median step. Whole runs A/B
         (`whole_run_overhead`, off/on interleaved) are reported too: on a shared 2-core machine their step
         times drift by +-10% between runs, more than the effect. `capture_direct` times the capture alone
         (a real step's groups, built and emitted 50 times) over the median step.
Writes bench/results/samples.json. Usage: python bench/samples.py [--quick] [--samples 100000] [--rounds 3]
[--out PATH]; `--smoke --out PATH`: 1,000 samples, 2-step runs of 16 prompts (checks it runs, in seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench_db import database_prepare, percentile  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "samples.json"
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/bench_samples"
FILTER = "reward_lte=0&finish_reason=length&staleness_gte=1"


def synthetic_sample(rng: random.Random, step: int, group: int, index: int) -> dict:
    """A run's sample with a plausible spread: a quarter at reward 0, 15% cut at the length budget, a third
    one or more versions stale (the filter matches about 1 in 100)."""
    from tests.sample_factory import sample_data

    reward = 0.0 if rng.random() < 0.25 else round(rng.random(), 3)
    return sample_data(
        step=step,
        group=group,
        index=index,
        reward=reward,
        advantage=rng.gauss(0, 1),
        finish_reason="length" if rng.random() < 0.15 else "stop",
        staleness=rng.choice([0, 0, 1, 2]) if rng.random() < 0.45 else 0,
        engine=f"engine-{rng.randrange(4)}",
        prompt="^" + "".join(rng.choice("0123456789") for _ in range(10)) + ">",
        completion="".join(rng.choice("0123456789") for _ in range(6)),
        prompt_index=rng.randrange(400),
    )


def bench_filter(n: int, queries: int) -> dict:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from runs.models import Run, Sample

    user, _ = get_user_model().objects.get_or_create(username="bench-samples")
    run = Run.objects.create(
        name="bench-samples",
        origin="api",
        run_class="app",
        kind="rl_train",
        owner=user,
        status="running",
        config={"samples_keep": n},
    )
    rng, seq, t0 = random.Random(0), 0, time.monotonic()
    ingest = Client()
    per_step, batch = 40, []
    for i in range(n):
        seq += 1
        batch.append({"seq": seq, "type": "sample", "data": synthetic_sample(rng, 1 + i // per_step, i // 8, i % 8)})
        if len(batch) == 1000 or i == n - 1:
            response = ingest.post(
                f"/api/runs/{run.pk}/ingest/",
                json.dumps(batch),
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
            )
            assert response.status_code == 200, response.content[:300]
            batch = []
    ingest_s = time.monotonic() - t0
    stored = Sample.objects.filter(run=run).count()
    assert stored == n, f"stored {stored} of {n}"
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_sample")
    reader = Client()
    reader.force_login(user)

    def timed(query: str) -> tuple[list[float], dict]:
        times, body = [], {}
        for _ in range(queries):
            start = time.perf_counter()
            response = reader.get(f"/api/runs/{run.pk}/samples/?{query}")
            times.append((time.perf_counter() - start) * 1000)
            assert response.status_code == 200, response.content[:300]
            body = response.json()
        return times, body

    timed(FILTER)  # warm the caches once, as a server that has answered before would be
    filtered, body = timed(FILTER)
    rows = body["results"]
    matching = Sample.objects.filter(run=run, reward__lte=0, finish_reason="length", staleness__gte=1).count()
    assert len(rows) == min(50, matching) and all(
        r["reward"] <= 0 and r["finish_reason"] == "length" and r["staleness"] >= 1 for r in rows
    ), "the filter's first page is wrong"
    plain, _ = timed("")
    Run.objects.filter(pk=run.pk).delete()
    return {
        "samples": stored,
        "filter": FILTER,
        "filter_rows": len(rows),
        "filter_p50_ms": round(percentile(filtered, 0.5), 2),
        "filter_p95_ms": round(percentile(filtered, 0.95), 2),
        "unfiltered_p95_ms": round(percentile(plain, 0.95), 2),
        "ratio_to_unfiltered": round(percentile(filtered, 0.95) / percentile(plain, 0.95), 3),
        "queries": queries,
        "ingest_seconds": round(ingest_s, 1),
    }


def train_steps(cfg_dict: dict, events_path: str, *, alternate: bool = False) -> tuple[list[float], list, dict]:
    """Run the trainer locally: (CPU seconds of each step after the first, the last step's groups, and with
    `alternate` the CPU seconds of the report phase on capture-on and capture-off steps). `alternate` turns
    capture off on every odd step (the run's config without capture, for that step's report only)."""
    from trainer.config import TrainConfig
    from trainer.loop import TrainingRun
    from trainer.sinks import EventEmitter, JsonlSink

    marks: list[float] = []
    last: list = []
    report: dict[str, list[float]] = {"on": [], "off": []}

    def on_step(_run: TrainingRun, groups: list) -> None:
        marks.append(time.process_time())
        last[:] = [groups]

    cfg = TrainConfig.from_dict(cfg_dict)
    quiet = cfg.replace(samples_groups_per_step=0, samples_best_worst=False)

    class Alternating(TrainingRun):
        def report(self, groups: list, stats: dict) -> None:
            capture = self.version % 2 == 0
            self.cfg = cfg if capture else quiet
            start = time.process_time()
            super().report(groups, stats)
            report["on" if capture else "off"].append(time.process_time() - start)
            self.cfg = cfg

    kind = Alternating if alternate else TrainingRun
    run = kind(cfg, emitter=EventEmitter([JsonlSink(events_path)]), on_step=on_step)
    run.run()
    run.emitter.close()
    return [b - a for a, b in zip(marks, marks[1:])], last[0], report


def bench_capture(rounds: int, steps: int, prompts: int = 64) -> dict:
    import torch

    from trainer.config import TrainConfig
    from trainer.problems import task_build
    from trainer.samples import samples_capture
    from trainer.sinks import EventEmitter, JsonlSink

    torch.set_num_threads(1)
    base = {"mode": "local", "steps": steps, "eval_every": 0, "prompts_per_step": prompts, "group_size": 8, "seed": 3}
    off = {**base, "samples_groups_per_step": 0, "samples_best_worst": False}
    on = {**base}  # the defaults: 2 drawn groups plus the best and the worst
    with tempfile.TemporaryDirectory() as tmp:
        # A/B inside one run: capture on even steps, off on odd ones; the report phase (where capture runs)
        # is timed on each, so the machine's drift over minutes cancels.
        all_steps, groups, report = train_steps(
            {**on, "steps": steps * rounds}, os.path.join(tmp, "alt.jsonl"), alternate=True
        )
        # A/B of whole runs, interleaved (off, on, on, off, ...): the plain comparison, noisier here.
        a_steps: list[float] = []
        b_steps: list[float] = []
        for r in range(2):
            pairs = ((off, a_steps), (on, b_steps)) if r % 2 == 0 else ((on, b_steps), (off, a_steps))
            for i, (cfg_dict, into) in enumerate(pairs):
                into += train_steps(cfg_dict, os.path.join(tmp, f"run{r}{i}.jsonl"))[0]
        cfg = TrainConfig.from_dict(on)
        task = task_build(cfg)
        emitter = EventEmitter([JsonlSink(os.path.join(tmp, "direct.jsonl"))])
        reps = 50
        start = time.process_time()
        for rep in range(reps):
            for sample in samples_capture(groups, task=task, step=rep + 1, cfg=cfg):
                emitter.emit("sample", dict(sample))
        direct = (time.process_time() - start) / reps
        emitter.close()
    step = statistics.median(all_steps)
    report_on, report_off = statistics.median(report["on"]), statistics.median(report["off"])
    a_med, b_med = statistics.median(a_steps), statistics.median(b_steps)
    return {
        "capture_overhead": round((report_on - report_off) / step, 4),
        "step_cpu_seconds": round(step, 4),
        "report_cpu_seconds_on": round(report_on, 5),
        "report_cpu_seconds_off": round(report_off, 5),
        "alternating_steps": {"on": len(report["on"]), "off": len(report["off"])},
        "capture_direct_seconds": round(direct, 5),
        "capture_direct": round(direct / step, 4),
        "whole_run_overhead": round(b_med / a_med - 1, 4),
        "whole_run_step_cpu_seconds": {"off": round(a_med, 4), "on": round(b_med, 4)},
        "capture_config": {"samples_groups_per_step": 2, "samples_best_worst": True, **base},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="10,000 samples, 1 round of 10 steps")
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4, help="the alternating run has rounds * steps steps")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--smoke", action="store_true", help="1,000 samples, 2-step runs (needs --out)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.smoke and args.out.resolve().is_relative_to(RESULTS.parent):
        parser.error("--smoke needs an --out outside bench/results/ (those files hold real measurements)")
    if args.quick:
        args.samples, args.queries, args.rounds, args.steps = 10_000, 50, 2, 10
    if args.smoke:
        args.samples, args.queries, args.rounds, args.steps = 1_000, 5, 1, 2
    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")
    import django

    django.setup()
    database_prepare(args.database_url)
    capture = bench_capture(args.rounds, args.steps, prompts=16 if args.smoke else 64)
    result = {**bench_filter(args.samples, args.queries), **capture}
    result["ok"] = result["filter_p95_ms"] <= 300 and result["capture_overhead"] <= 0.02
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
