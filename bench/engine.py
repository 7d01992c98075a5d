"""Benchmark the batching engine against the one-request-at-a-time path. Writes bench/results/engine.json.

    python bench/engine.py [--quick]

Same model (the default config's policy, seed 0), same prompts (the task's training prompts in order), same
process, same moment, torch pinned to one thread. At each concurrency C (1, 16, 64), C clients each run
episodes back to back on new sessions (the default `digits` task: G=8 rows, one turn of 3 tokens, the prompt
fed first) against one `Engine` on this process's event loop, for a fixed number of episodes:
- batched: `Engine(max_batch=64)`: admitted requests share forward steps;
- serial: `Engine(max_batch=1)`: the same engine serving one request at a time, which is what the engine did
  before batching (its generation held the event loop for the whole request). For reference the old code path
  itself (`trainer.policy.sample_tokens` on a per-session cache, one request after another) is also timed and
  printed, not stored: it shows the serial baseline is not slower than the code it replaces.
Rounds alternate serial/batched; medians are reported. `ratio` = batched / serial tokens per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from trainer.config import TrainConfig  # noqa: E402
from trainer.engine import Engine  # noqa: E402
from trainer.policy import sample_tokens  # noqa: E402
from trainer.problems import task_build  # noqa: E402

CONCURRENCY = (1, 16, 64)


async def _clients(engine: Engine, cfg: TrainConfig, concurrency: int, episodes: int) -> float:
    """Tokens per second of `concurrency` clients running `episodes` episodes in all."""
    task = task_build(cfg)
    prompts = task.train_prompts
    todo = iter(range(episodes))
    n = task.turn_len()

    async def client(c: int) -> int:
        made = 0
        for i in todo:
            rows = [task.prompt_tokens(prompts[i % len(prompts)])] * cfg.group_size
            sid = f"c{c}-e{i}"
            out = await engine.generate(sid, rows, n, i, f"{sid}/t0")
            engine.end_session(sid)
            made += sum(len(r) for r in out["tokens"])
        return made

    t0 = time.perf_counter()
    made = await asyncio.gather(*(client(c) for c in range(concurrency)))
    return sum(made) / (time.perf_counter() - t0)


def old_path_tokens_per_s(cfg: TrainConfig, episodes: int) -> float:
    """The pre-batching engine's computation: sample_tokens per request on a per-session cache."""
    task = task_build(cfg)
    torch.manual_seed(cfg.seed)
    engine = Engine(cfg, "old", max_batch=1)
    made, t0 = 0, time.perf_counter()
    for i in range(episodes):
        rows = torch.tensor([task.prompt_tokens(task.train_prompts[i % len(task.train_prompts)])] * cfg.group_size)
        gen = torch.Generator().manual_seed(i)
        tokens, *_ = sample_tokens(engine.model, rows, None, task.turn_len(), temperature=1.0, generator=gen)
        made += tokens.numel()
    return made / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = TrainConfig(mode="local", device="cpu")
    rounds = 1 if args.quick else args.rounds
    result: dict[str, dict[str, dict[str, float]]] = {"concurrency": {}}
    for c in CONCURRENCY:
        episodes = max(32, 8 * c) if not args.quick else max(16, 2 * c)
        serial, batched = [], []
        for _ in range(rounds):
            serial.append(asyncio.run(_clients(Engine(cfg, "serial", max_batch=1, threads=1), cfg, c, episodes)))
            batched.append(asyncio.run(_clients(Engine(cfg, "batched", max_batch=64, threads=1), cfg, c, episodes)))
        s, b = statistics.median(serial), statistics.median(batched)
        result["concurrency"][str(c)] = {"tokens_per_s_batched": b, "tokens_per_s_serial": s, "ratio": b / s}
        print(f"concurrency {c:3d}: batched {b:9.0f} tok/s  serial {s:9.0f} tok/s  ratio {b / s:5.2f}", flush=True)
    print(f"old sample_tokens path, one request at a time: {old_path_tokens_per_s(cfg, 256):9.0f} tok/s")
    out = ROOT / "bench" / "results" / "engine.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
