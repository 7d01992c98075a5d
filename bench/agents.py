"""Throughput of the session server (agents/server.py) against the in-process engine path, and of the platform's
proxy in front of it, side by side in one invocation. Writes `concurrency` and `proxy` of bench/results/agents.json
(its other keys, `learning` and `tool_calls`, are written by other code and kept).

    python bench/agents.py [--quick] [--rounds N] [--database-url URL] [--out PATH]
    python bench/agents.py --smoke --out PATH   (one round of one session per client: checks it runs; on the Ray
                                                 cluster at RAY_ADDRESS when set, else on a head of its own)

Topology, the one a run's Ray job deploys (trainer/topology.py, the default modes): one `trainer.engine.Engine`
as an async Ray actor (a chat policy: TrainConfig(environment="digits"), shape from trainer.problems.policy_shape,
torch on one thread) and a session server in its own async Ray actor in front of it (agents.deploy.deploy_server,
loopback); the clients run in this driver process. So both paths cross the same process boundaries a run's
rollout worker does and the comparison isolates what the server adds:
- in-process (`inproc_tokens_s`): each turn is a `rollout.TurnCall` through a `rollout.CallCoalescer` on the
  engine's Ray handle (`Engine.generate_many`, one call per tick of the clients' loop), exactly as
  trainer/worker.py sends it (the turn's chat-template ids, the session's cache reused by `continues`, the last
  turn ends the session);
- HTTP (`http_tokens_s`): the official `openai.AsyncOpenAI` client as a rollout worker builds it
  (trainer/agent_episodes.py `openai_client`: the openai package's aiohttp transport), each turn sent as the
  shipped environments send theirs (`agents.environments.chat_completion`: the client's low-level `post`) on
  loopback, the whole history resent each turn, the session taken from and ended through a
  `trainer.agent_episodes.ServerSessions` as a rollout worker's are (opened 32 at a time, ended in shared calls;
  those calls count in the wall time, not in a request's latency);
- proxy (`proxy."64"`): the same clients against `/api/runs/<id>/v1` of a real daphne (runs/api/proxy.py) on a
  temporary SQLite database (or `--database-url`), a running Run whose serving_url is the server and whose
  serving key is the server's bearer key, an API token of its owner; the per-user throttle raised out of the way.
Load per concurrency C: C clients on one event loop run sessions back to back until S sessions are done; every
session has TURNS turns of a short user message and max_tokens MAX_TOKENS, the same seeds on every side (a
random-init policy may sample `<|end|>` early: tokens/s counts the tokens actually generated). Added latency per
request: that request's (same session index, same turn) latency minus its in-process latency (the proxy's: minus
its direct HTTP latency); p50 and p99. `--database-url` is migrated and gets a bench user and run (left there).
Rounds alternate the side order (round 1: inproc, http, proxy; round 2 reversed; ...). Stored: tokens/s as medians
over rounds, `ratio` the median of per-round ratios (two sides measured back to back under the same load), its
spread and every round's ratio, never the best; the load average beside the numbers (the machine is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))  # this run's own; daphne gets the same
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
for _name in ("LOG_LEVEL", "LOG_LEVEL_CHATTER"):  # Django's logging config would print every request (httpx)
    os.environ.setdefault(_name, "WARNING")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.chat import STOP, render  # noqa: E402
from agents.environments import chat_completion  # noqa: E402
from bench.cpu import cpu_by_role  # noqa: E402
from rollout.coalesce import CallCoalescer  # noqa: E402
from rollout.invoke import call  # noqa: E402
from rollout.types import TurnCall  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402

CONCURRENCY = (1, 16, 64)
PROXY_C = 64
TURNS, MAX_TOKENS = 3, 16
CFG = TrainConfig(environment="digits", context_tokens=128, group_size=2, device="cpu", seed=0)
OUT = ROOT / "bench" / "results" / "agents.json"


def user_text(s: int, t: int) -> str:
    return " ".join(str((7 * s + 3 * t + i) % 10) for i in range(4 + t))


def seed(s: int, t: int) -> int:
    return 1000 * s + t


class Sides:
    """The three ways to run one session; each records {(s, t): latency_s} and returns the tokens generated."""

    def __init__(self, engine: Any, server: Any, url: str, key: str, proxy: tuple[str, str, int]) -> None:
        from openai import AsyncOpenAI, DefaultAioHttpClient

        from trainer.agent_episodes import ServerSessions, Serving, openai_client

        self.engine, self.server = engine, server
        self.turns = CallCoalescer(engine, "generate_many")  # a rollout worker's engine calls, one per loop tick
        self.direct = openai_client(Serving(server, url, key))  # the rollout worker's client, transport included
        self.sessions = ServerSessions(server, "bench")  # and its sessions
        base, token, self.user_id = proxy
        self.proxy = AsyncOpenAI(
            base_url=base, api_key=token, max_retries=0, timeout=120, http_client=DefaultAioHttpClient(timeout=120)
        )

    async def close(self) -> None:
        """Close both clients' aiohttp sessions (left open, each warned "Unclosed client session" at exit)."""
        await self.direct.close()
        await self.proxy.close()

    async def inproc(self, sid: str, s: int, lat: dict) -> int:
        made, stopped = 0, True
        for t in range(TURNS):
            feed = render([{"role": "user", "content": user_text(s, t)}])
            feed = feed if t == 0 or stopped else [STOP, *feed]  # as the server closes a turn cut at max_tokens
            t0 = time.perf_counter()
            turn = TurnCall(sid, [feed], MAX_TOKENS, seed(s, t), f"{sid}/{t}", False, t > 0, t == TURNS - 1, (STOP,))
            out = await self.turns.submit(turn)
            lat[(s, t)] = time.perf_counter() - t0
            made += len(out["tokens"][0])
            stopped = out["finish_reasons"][0] == "stop"
        return made

    async def http(self, sid: str, s: int, lat: dict) -> int:
        [opened] = await self.sessions.take(1)  # `sid` names the in-process side's session; the pool names its own
        made = await self._chat(self.direct, opened, s, lat)
        await self.sessions.end([opened])
        return made

    async def via_proxy(self, sid: str, s: int, lat: dict) -> int:
        made = await self._chat(self.proxy, sid, s, lat)
        await call(self.server, "end_session", f"ext-{self.user_id}-{sid}")  # free its engine rows
        return made

    @staticmethod
    async def _chat(client: Any, sid: str, s: int, lat: dict) -> int:
        messages: list[dict[str, str]] = []
        made = 0
        for t in range(TURNS):
            messages.append({"role": "user", "content": user_text(s, t)})
            t0 = time.perf_counter()
            body = {"model": "policy", "messages": messages, "max_tokens": MAX_TOKENS, "seed": seed(s, t)}
            answer = await chat_completion(client, {**body, "session_id": sid})
            lat[(s, t)] = time.perf_counter() - t0
            made += answer["usage"]["completion_tokens"]
            messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"] or ""})
        return made


async def measure(run_one: Any, tag: str, concurrency: int, sessions: int) -> dict[str, Any]:
    """Tokens/s of `concurrency` clients running `sessions` sessions back to back, every request's latency, and
    the CPU milliseconds per request of each role (`driver`: the clients; the engine, the session server, Ray's
    own processes, `other`: daphne), which say where the side's time went."""
    todo = iter(range(sessions))
    lat: dict[tuple[int, int], float] = {}

    async def client() -> int:
        return sum([await run_one(f"{tag}-s{s}", s, lat) for s in todo])

    cpu0, t0 = cpu_by_role(), time.perf_counter()
    made = sum(await asyncio.gather(*(client() for _ in range(concurrency))))
    seconds, cpu1 = time.perf_counter() - t0, cpu_by_role()
    used = {role: cpu1[role] - cpu0.get(role, 0.0) for role in cpu1}
    cpu_ms = {role: round(1000 * v / len(lat), 3) for role, v in sorted(used.items()) if v >= 0.005}
    return {"tokens_s": made / seconds, "tokens": made, "lat": lat, "cpu_ms_per_request": cpu_ms}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def added_ms(slow: dict, fast: dict) -> tuple[float, float]:
    """p50, p99 over requests of (latency on the slower side - the same request's on the faster side), in ms."""
    diffs = [(slow[k] - fast[k]) * 1000 for k in slow if k in fast]
    return pct(diffs, 0.5), pct(diffs, 0.99)


def _p50(side: dict[str, Any]) -> float:
    return pct(list(side["lat"].values()), 0.5) * 1000


class Platform:
    """daphne serving the platform on a scratch database, a user with an API token and a running Run that serves
    through the bench's session server (its serving key is the server's bearer key)."""

    def __init__(self, database_url: str | None) -> None:
        self.tmp = tempfile.mkdtemp(prefix="bench-agents-")
        os.environ["DATABASE_URL"] = database_url or f"sqlite:///{self.tmp}/db.sqlite3"
        os.environ.pop("REDIS_URL", None)  # one web process: the throttle counts in its local memory
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "LOG_LEVEL": "WARNING"}
        self.env["THROTTLE_RATE_AGENTS"] = "1000000/min"  # the proxy's per-user throttle is not what is measured
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=self.env, check=True)
        import django

        django.setup()
        from django.contrib.auth import get_user_model

        from runs.auth.tokens import token_issue
        from runs.models import Run, RunStatus

        user = get_user_model().objects.create_user(username=f"bench{secrets.token_hex(4)}", password=None)
        self.run = Run.objects.create(
            name="bench-agents", origin="api", run_class="app", kind="rl_train", owner=user, status=RunStatus.RUNNING
        )
        self.key, self.token, self.user_id = self.run.serving_keys()[0], token_issue(user), user.pk
        self.web: Any = None

    def serve(self, serving_url: str) -> tuple[str, str, int]:
        """Point the run at the server, start daphne; (proxy base URL, token, user id)."""
        from tests.realtime.servers import Daphne  # the test suite's launcher (waits for its port)

        self.run.serving_url = serving_url
        self.run.save(update_fields=["serving_url"])
        self.web = Daphne(self.env)
        return f"{self.web.http}/api/runs/{self.run.pk}/v1", self.token, self.user_id

    def close(self) -> None:
        if self.web is not None:
            self.web.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


async def one_round(sides: Sides, r: int, size: str) -> dict[str, Any]:
    """Every concurrency once, the sides in this round's order; per concurrency each side's measure."""
    out: dict[str, Any] = {}
    for c in CONCURRENCY:
        sessions = {"smoke": c, "quick": max(8, 2 * c), "full": max(24, 4 * c)}[size]
        order = [("inproc", sides.inproc), ("http", sides.http), ("proxy", sides.via_proxy)][: 3 if c == PROXY_C else 2]
        got = {}
        for name, run_one in order if r % 2 == 0 else reversed(order):
            got[name] = await measure(run_one, f"r{r}-c{c}-{name}", c, sessions)
        out[str(c)] = {**got, "sessions": sessions}
        line = "  ".join(f"{k} {v['tokens_s']:7.0f} tok/s" for k, v in got.items())
        print(f"round {r + 1} concurrency {c:3d}: {line}", flush=True)
    return out


def compare(per: list[dict[str, Any]], slow: str, fast: str) -> dict[str, Any]:
    """`slow` against `fast` over rounds: the median of per-round tokens/s ratios, its spread, added latency."""
    ratios = [p[slow]["tokens_s"] / p[fast]["tokens_s"] for p in per]
    sides = (fast, slow)
    added = [added_ms(p[slow]["lat"], p[fast]["lat"]) for p in per]
    return {
        "ratio": statistics.median(ratios),
        "added_p50_ms": statistics.median(a[0] for a in added),
        "added_p99_ms": statistics.median(a[1] for a in added),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratios": ratios,
        "p50_ms": {side: statistics.median(_p50(p[side]) for p in per) for side in (fast, slow)},
        "tokens": {side: [p[side]["tokens"] for p in per] for side in (fast, slow)},
        "cpu_ms_per_request": {side: _median_cpu([p[side]["cpu_ms_per_request"] for p in per]) for side in sides},
    }


def _median_cpu(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Per role, the median over rounds of its CPU ms per request (0 in a round where it used none)."""
    roles = sorted({role for r in rounds for role in r})
    return {role: round(statistics.median(r.get(role, 0.0) for r in rounds), 3) for role in roles}


def summarize(rounds: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    def tokens_s(per: list[dict[str, Any]], side: str) -> float:
        return statistics.median(p[side]["tokens_s"] for p in per)

    concurrency = {}
    for c in CONCURRENCY:
        per = [rd[str(c)] for rd in rounds]
        concurrency[str(c)] = {
            "http_tokens_s": tokens_s(per, "http"),
            "inproc_tokens_s": tokens_s(per, "inproc"),
            **compare(per, "http", "inproc"),
            "sessions": per[0]["sessions"],
        }
    per = [rd[str(PROXY_C)] for rd in rounds]
    vs = "direct HTTP to the session server, same round"
    return concurrency, {str(PROXY_C): {"tokens_s": tokens_s(per, "proxy"), **compare(per, "proxy", "http"), "vs": vs}}


async def run_rounds(deployed: tuple[Any, Any, str, str, Any], rounds: int, size: str) -> dict[str, Any]:
    """Every round's measures (latencies included) and the load average around each."""
    sides = Sides(*deployed)
    await measure(sides.http, "warmup", 4, 8)  # first calls pay imports and connection setup
    results, loads = [], []
    try:
        for r in range(rounds):
            before = os.getloadavg()
            results.append(await one_round(sides, r, size))
            loads.append([round(x, 2) for x in (*before, *os.getloadavg())])
    finally:
        await sides.close()
    return {"rounds": results, "load_average_per_round": loads}


def bench(args: argparse.Namespace, rounds: int) -> dict[str, Any]:
    """Set up (synchronously: the ORM and Ray's blocking calls stay off the event loop), then measure."""
    import ray

    from agents.deploy import deploy_server
    from trainer.engine import Engine
    from trainer.problems import policy_shape

    platform = Platform(args.database_url)
    shared = os.environ.get("RAY_ADDRESS") if args.smoke else None  # measurements always get a head of their own
    if shared:
        ray.init(address=shared, log_to_driver=False)
    else:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        engine = ray.remote(Engine).options(num_cpus=0, max_concurrency=1000).remote(CFG, "e0", max_sessions=160)
        ray.get(engine.ping.remote(), timeout=120)
        server, url = deploy_server({"e0": engine}, block_size=policy_shape(CFG)[1], key=platform.key, run="bench")
        proxy = platform.serve(url)
        size = "smoke" if args.smoke else "quick" if args.quick else "full"
        return asyncio.run(run_rounds((engine, server, url, platform.key, proxy), rounds, size))
    finally:
        ray.shutdown()
        platform.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one round of fewer sessions (under 3 minutes)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--database-url", help="the platform's database for the proxy (default: a temporary SQLite)")
    ap.add_argument("--smoke", action="store_true", help="one round, one session per client (needs --out)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.rounds < 3 and not (args.quick or args.smoke):
        ap.error("--rounds must be at least 3 (the median of one or two rounds is not a median)")
    if args.smoke and args.out.resolve().is_relative_to(OUT.parent):
        ap.error("--smoke needs an --out outside bench/results/ (those files hold real measurements)")
    rounds = 1 if args.quick or args.smoke else args.rounds
    t0 = time.monotonic()
    measured = bench(args, rounds)
    concurrency, proxy = summarize(measured["rounds"])
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update(concurrency=concurrency, proxy=proxy)
    result["throughput_run"] = {
        **{"rounds": rounds, "quick": args.quick, "turns": TURNS, "max_tokens": MAX_TOKENS, "cpus": os.cpu_count()},
        "load_average_per_round": measured["load_average_per_round"],  # 1/5/15 min before, then after
        "wall_s": round(time.monotonic() - t0, 1),
        "topology": "engine and session server as Ray actors (loopback), clients in the driver",
        "database": args.database_url.split("@")[-1] if args.database_url else "sqlite (temporary)",
        "config": {k: getattr(CFG, k) for k in ("environment", "context_tokens", "d_model", "n_layer", "n_head")},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    table(result, args.out)


def table(result: dict[str, Any], out: Path) -> None:
    print(f"\n{'C':>4} {'inproc tok/s':>13} {'http tok/s':>11} {'ratio':>6} {'spread':>11} {'+p50 ms':>8} {'+p99':>8}")
    for c, row in result["concurrency"].items():
        spread = f"{row['ratio_min']:.2f}-{row['ratio_max']:.2f}"
        print(
            f"{c:>4} {row['inproc_tokens_s']:13.0f} {row['http_tokens_s']:11.0f} {row['ratio']:6.2f} {spread:>11}"
            f" {row['added_p50_ms']:8.1f} {row['added_p99_ms']:8.1f}"
        )
    for c, row in result["proxy"].items():
        print(f"proxy {c}: {row['tokens_s']:.0f} tok/s, {row['ratio']:.2f}x direct, +p99 {row['added_p99_ms']:.0f} ms")
    print(f"load average 1/5/15 min, before/after each round: {result['throughput_run']['load_average_per_round']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
