"""Benchmark the batching engine against the one-request-at-a-time path. Writes bench/results/engine.json.

    python bench/engine.py [--quick] [--rounds N] [--out PATH]
    python bench/engine.py --smoke --out PATH   (one round, one episode per client: checks it runs, in seconds)

Same model (the default config's policy, seed 0), same prompts (the task's training prompts in order), same
process, torch pinned to one thread. At each concurrency C (1, 16, 64), C clients on one event loop each run
episodes back to back on new sessions (the default `digits` task: G=8 rows, one turn of 3 tokens after the
prompt) until a fixed number of episodes is done:
- serial (`tokens_per_s_serial`): `OldEngine` below, the engine as it was before batching (trainer/engine.py at
  c63d432): a request takes its gate lease and runs `trainer.policy.sample_tokens` on its session's cache
  synchronously, holding the event loop, so requests are served one at a time whatever C is;
- batched (`tokens_per_s_batched`): `trainer.engine.Engine` (max_batch 64), requests of all clients share
  forward steps on its step thread (a lone request's cheap steps run on the event loop: docs/trainer.md).
Also printed, not stored: the new engine with max_batch=1 (one request per step: batching off). Each round
measures serial then batched back to back (then the max_batch=1 engine); at least 3 rounds (default 5). Stored per
concurrency: tokens/s as medians over rounds, `ratio` the median of the per-round ratios batched / serial (on this
shared machine the load moves within seconds, so a ratio of two measurements taken together is steadier than a
ratio of two medians), the spread `ratio_min`/`ratio_max` and every round's ratio (`ratios`), never the best.
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
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from rollout.gate import RequestGate  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.engine import Engine  # noqa: E402
from trainer.policy import build_policy, sample_tokens  # noqa: E402
from trainer.problems import task_build  # noqa: E402

CONCURRENCY = (1, 16, 64)
OUT = ROOT / "bench" / "results" / "engine.json"


class OldEngine:
    """The pre-batching engine's request path, kept here as the baseline (same model, gate and cache reuse)."""

    def __init__(self, cfg: TrainConfig) -> None:
        task = task_build(cfg)
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.model = build_policy(cfg, task.vocab_size, task.block_size()).eval()
        self.gate = RequestGate(name="old")
        self.sessions: dict[str, tuple[Any, torch.Tensor]] = {}

    async def generate(self, session_id: str, rows: list[list[int]], n: int, seed: int, request_id: str) -> dict:
        async with self.gate.lease(session_id, request_id=request_id) as lease:
            feed = torch.tensor(rows, dtype=torch.long)
            cache = None
            if session_id in self.sessions:
                cache, pending = self.sessions[session_id]
                feed = torch.cat([pending, feed], dim=1)
            gen = torch.Generator().manual_seed(seed)
            tokens, logps, kv, pending = sample_tokens(
                self.model, feed, cache, n, temperature=self.cfg.temperature, generator=gen
            )
            self.sessions[session_id] = (kv, pending)
            return {"tokens": tokens.tolist(), "logprobs": logps.tolist(), "version": lease.version}

    def end_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)


async def _clients(engine: Any, cfg: TrainConfig, concurrency: int, episodes: int) -> float:
    """Tokens per second of `concurrency` clients running `episodes` episodes in all."""
    task = task_build(cfg)
    prompts = [task.prompt_tokens(p) for p in task.train_prompts[:episodes]]
    todo = iter(range(episodes))
    n = task.turn_len()

    async def client(c: int) -> int:
        made = 0
        for i in todo:
            sid = f"c{c}-e{i}"
            out = await engine.generate(sid, [prompts[i % len(prompts)]] * cfg.group_size, n, i, f"{sid}/t0")
            engine.end_session(sid)
            made += sum(len(r) for r in out["tokens"])
        return made

    t0 = time.perf_counter()
    made = await asyncio.gather(*(client(c) for c in range(concurrency)))
    return sum(made) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="one round, one episode per client (needs --out)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.smoke and args.out.resolve().is_relative_to(OUT.parent):
        parser.error("--smoke needs an --out outside bench/results/ (those files hold real measurements)")
    if args.rounds < 3 and not args.quick:
        parser.error("--rounds must be at least 3 (the median of one or two rounds is not a median)")
    torch.set_num_threads(1)
    cfg = TrainConfig(mode="local", device="cpu")
    rounds = 1 if args.quick or args.smoke else args.rounds
    result: dict[str, Any] = {"concurrency": {}, "rounds": rounds}
    for c in CONCURRENCY:
        # At least 256 episodes: a lone session's run is then ~1 s, long enough to outlast a scheduler hiccup.
        episodes = c if args.smoke else max(16, 2 * c) if args.quick else max(256, 8 * c)
        serial, batched, one = [], [], []
        for _ in range(rounds):
            serial.append(asyncio.run(_clients(OldEngine(cfg), cfg, c, episodes)))
            batched.append(asyncio.run(_clients(Engine(cfg, "batched", max_batch=64, threads=1), cfg, c, episodes)))
            one.append(asyncio.run(_clients(Engine(cfg, "max_batch_1", max_batch=1, threads=1), cfg, c, episodes)))
        s, b = statistics.median(serial), statistics.median(batched)
        ratios = [x / y for x, y in zip(batched, serial)]
        ratio = statistics.median(ratios)
        result["concurrency"][str(c)] = {
            "tokens_per_s_batched": b,
            "tokens_per_s_serial": s,
            "ratio": ratio,
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "ratios": ratios,
            "episodes": episodes,
        }
        print(
            f"concurrency {c:3d}: batched {b:8.0f} tok/s  serial (old engine) {s:8.0f} tok/s  ratio {ratio:5.2f}"
            f" (spread {min(ratios):.2f}-{max(ratios):.2f})"
            f"  (new engine, max_batch=1: {statistics.median(one):8.0f} tok/s)",
            flush=True,
        )
        print(f"    rounds: batched {[round(x) for x in batched]}  serial {[round(x) for x in serial]}", flush=True)
    result["load_average"] = os.getloadavg()  # the machine is shared: read the numbers with the load beside them
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
