"""Every benchmark in bench/ runs in its smoke mode (`--smoke --out PATH`: the smallest sizes, one round, seconds
each) and writes the keys its real results file, bench/results/<name>.json, has; so no bench breaks unnoticed.
Nothing here asserts a time or a number: a smoke run measures nothing worth reading.

Each bench runs as a subprocess, in its own process group (whatever of it outlives it is killed), on the suite's
services: PostgreSQL at DATABASE_URL (benches that keep a database between real runs get a scratch one here,
dropped afterwards), Redis at REDIS_URL, and the suite's shared Ray head (RAY_ADDRESS; a bench in smoke mode
joins it instead of starting a head of its own, which costs more than the bench itself on this machine).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BASE_DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
TIMEOUT_S = 300  # a smoke run takes seconds; this is for a hung one

# Per bench: what it needs from the suite. `scratch_db`: the option or variable that names its database (the
# bench creates it when missing; the test drops it). `results`/`keys`: benches that share a results file (default
# bench/results/<name>.json, every key) each write only their own top-level keys of it.
AGENTS_THROUGHPUT_KEYS = ("concurrency", "proxy", "throughput_run")
AGENTS_LEARNING_KEYS = ("learning", "tool_calls", "learning_run")
BENCHES: dict[str, dict] = {
    "agents": {"ray": True, "keys": AGENTS_THROUGHPUT_KEYS},
    "agents_learning": {"results": "agents", "keys": AGENTS_LEARNING_KEYS},  # local mode: no Ray head needed
    "async": {"ray": True},
    "dashboard": {},
    "engine": {},
    "events": {"scratch_db": "BENCH_DATABASE_URL"},
    "fairness": {},
    "learning": {"ray": True},
    "rollout": {"ray": True},
    "samples": {"scratch_db": "--database-url"},
    "slots": {},
    "webhooks": {"scratch_db": "BENCH_DATABASE_URL"},
}
MARKS = {"dashboard": [pytest.mark.browser]}


def missing_keys(real: object, smoke: object, path: str = "") -> list[str]:
    """Key paths of the real results that the smoke results lack. A dict keyed by sizes (concurrency levels,
    queue depths: every key a number) may hold other sizes in smoke mode: each of its entries is held to the real
    file's first entry. `config` (a TrainConfig's fields, not the bench's keys), `cpu_ms_per_request` (keyed by the
    roles of the processes the bench started: on a shared Ray cluster, the bench's own process alone) and lists are
    not looked into."""
    if not isinstance(real, dict) or not real:
        return []
    if not isinstance(smoke, dict):
        return [path or "."]
    if all(k.isdigit() for k in real):
        first = real[next(iter(real))]
        return [p for k, v in smoke.items() for p in missing_keys(first, v, f"{path}{k}.")] if smoke else [path[:-1]]
    out = []
    for key, value in real.items():
        if key not in smoke:
            out.append(f"{path}{key}")
        elif key not in ("config", "cpu_ms_per_request"):
            out += missing_keys(value, smoke[key], f"{path}{key}.")
    return out


def scratch_url(name: str) -> str:
    return urlunsplit(urlsplit(BASE_DATABASE_URL)._replace(path=f"/{name}"))


def drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(BASE_DATABASE_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_bench(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run a bench in a process group of its own; kill what of the group is left once it ends or times out."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return -1, f"timed out after {TIMEOUT_S} s\n{output}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, output


@pytest.mark.parametrize("name", [pytest.param(n, marks=MARKS.get(n, [])) for n in BENCHES])
def test_bench_smoke(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    needs = BENCHES[name]
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, str(ROOT / "bench" / f"{name}.py"), "--smoke", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    if needs.get("ray"):
        env["RAY_ADDRESS"] = request.getfixturevalue("ray_cluster").address
    scratch = f"bench_{name}_smoke_{os.getpid()}"
    if option := needs.get("scratch_db"):
        if option.startswith("--"):
            cmd += [option, scratch_url(scratch)]
        else:
            env[option] = scratch_url(scratch)
    t0 = time.monotonic()
    try:
        code, output = run_bench(cmd, env)
    finally:
        if needs.get("scratch_db"):
            drop_database(scratch)
    print(f"bench/{name}.py --smoke: {time.monotonic() - t0:.1f} s")
    assert code == 0, f"bench/{name}.py --smoke exited {code}:\n{output[-6000:]}"
    smoke = json.loads(out.read_text())
    real = json.loads((RESULTS / f"{needs.get('results', name)}.json").read_text())
    if "keys" in needs:
        real = {key: value for key, value in real.items() if key in needs["keys"]}
    assert not missing_keys(real, smoke), f"bench/{name}.py --smoke lacks {missing_keys(real, smoke)}"


def test_every_key_of_a_shared_results_file_has_a_bench_that_writes_it() -> None:
    """A results file two benches share holds only keys one of them writes (and so one of the smoke runs checks)."""
    for results in {needs["results"] for needs in BENCHES.values() if "results" in needs}:
        owners = [name for name, needs in BENCHES.items() if needs.get("results", name) == results]
        written = {key for name in owners for key in BENCHES[name].get("keys", ())}
        stored = set(json.loads((RESULTS / f"{results}.json").read_text()))
        assert stored <= written, f"bench/results/{results}.json: no bench writes {sorted(stored - written)}"


def test_smoke_never_writes_the_results_files() -> None:
    """bench/results/*.json hold real measurements: a smoke run without --out (whose default is the results file)
    is refused before it runs anything, and so is one with an --out into bench/results/ (the same check, run here
    for one bench: each start costs seconds of imports)."""
    runs = [[name] for name in BENCHES] + [["engine", "--out", str(RESULTS / "engine.json")]]
    for name, *extra in runs:
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / f"{name}.py"), "--smoke", *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and "--smoke needs an --out" in done.stderr, (name, extra, done.stderr)
