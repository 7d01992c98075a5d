"""Admission matches capacity, end to end (issue 11's acceptance): `make run` on this machine, then six default
runs of 8 steps submitted at once through the API. Every one must succeed without ever failing (none failed,
reclaimed or lost on the way). Liveness settings are the platform's defaults: nothing may die of a busy machine.

Times come from the runs' own timestamps (created, granted, finished), not from this test's polling. `serial_s`
is six times the mean time of one such run alone (grant to finish), measured twice in the same platform: once
before the crowd and once right after it, so a machine that is slower (or faster) for a while weighs on both
sides. The crowd's `wall_s` runs from its first submit to its last finish. bench/results/capacity.json gets
both, their ratio and each crowd run's grant, start and finish (seconds from the first submit), which say where
any extra time went.

A default run uses about 1.75 of this machine's 2 cores while it trains, so admission runs one at a time here
and the six take about the serial time (docs/slots.md), within the noise of single runs. The test asserts
what admission controls exactly: no crowd run waits while the machine is idle (at most IDLE_S before each
grant), no more runs are held at once than max_total, and none fails or is reclaimed on the way (a run
requeued after a placement timeout shows as idle time before its grant). The ratio to the serial time is
reported, and bounded by SLOWER_THAN_SERIAL against gross slowdowns. No test runs beside this one
(`quiet_machine`, tests/quiet.py): a platform training next to it weighed on its single runs or its crowd
alone.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path

import pytest
import requests

from tests.conftest import REPO_ROOT
from tests.platform_up import shared_platform, up  # noqa: F401 - fixtures: the shared `make run` platform

RESULTS = REPO_ROOT / "bench" / "results" / "capacity.json"
# 8 steps: admission is what is measured, and a run's start (grant to running) is as long as in a longer run. At 20
# steps this test took 277 s of a 37-minute suite, and past its 600 s timeout on a machine 2.5 times slower.
RUN = {"origin": "api", "kind": "rl_train", "config": {"steps": 8}}
FINISHED = {"succeeded", "failed", "cancelled"}
# One default run of 20 steps alone took 26.1-36.2 s within one invocation here (same code, same platform), so the
# ratio of six to two such runs is noise around 1 (0.94-1.12 in four invocations of this test on 2026-12-01):
# the ratio bound only guards against gross slowdowns; stalls and thrash are asserted exactly (IDLE_S, overlap).
SLOWER_THAN_SERIAL = 1.25
# Most seconds before a crowd run's grant: a release grants the next run itself (measured 0.0 s); a grant left
# to the tick (every 2 s) would show.
IDLE_S = 1.0


def submit(url: str, headers: dict[str, str], name: str) -> int:
    reply = requests.post(f"{url}/api/runs/", headers=headers, json={"name": name, **RUN}, timeout=30)
    assert reply.status_code == 201, reply.text
    return int(reply.json()["id"])


def wait_finished(url: str, headers: dict[str, str], ids: list[int], timeout_s: float) -> list[dict]:
    """The runs once all have finished; polls only those still going, every 2 s (the times measured are the
    runs' own timestamps, so the polling only has to be cheap: it shares the machine with the runs)."""
    deadline = time.monotonic() + timeout_s
    done: dict[int, dict] = {}
    while time.monotonic() < deadline:
        for i in [i for i in ids if i not in done]:
            run = requests.get(f"{url}/api/runs/{i}/", headers=headers, timeout=30).json()
            if run["status"] in FINISHED:
                done[i] = run
        if len(done) == len(ids):
            return [done[i] for i in ids]
        time.sleep(2.0)
    pytest.fail(f"runs {ids} not finished after {timeout_s} s: finished {sorted(done)}", pytrace=False)


def at(run: dict, key: str) -> float:
    return datetime.fromisoformat(run[key].replace("Z", "+00:00")).timestamp()


def ran_alone_s(url: str, headers: dict[str, str], run_id: int) -> float:
    """A run measured alone: it succeeded without failing on the way; seconds from its grant to its finish."""
    (run,) = wait_finished(url, headers, [run_id], 600)
    assert run["status"] == "succeeded" and "failed" not in statuses_seen(url, headers, run_id), run
    return at(run, "finished_at") - at(run, "granted_at")


def alone(url: str, headers: dict[str, str], name: str) -> float:
    """One run alone (`ran_alone_s`), then a wait until nothing runs, its follow-up evaluation included, so the
    crowd starts on an idle platform."""
    seconds = ran_alone_s(url, headers, submit(url, headers, name))
    deadline = time.monotonic() + 300
    while requests.get(f"{url}/api/slots/", headers=headers, timeout=30).json()["total"]["running"]:
        assert time.monotonic() < deadline, "the platform did not become idle"
        time.sleep(0.5)
    return seconds


def statuses_seen(url: str, headers: dict[str, str], run_id: int) -> list[str]:
    events = requests.get(f"{url}/api/runs/{run_id}/events/", headers=headers, timeout=30).json()
    return [e["data"]["status"] for e in events if e["type"] == "status"]


@pytest.mark.slow
# 600 s (pytest.ini) for the test itself, plus the test beside that quiet_machine may wait for (the longest,
# test_restart's first, took 144-219 s here).
@pytest.mark.timeout(900)
def test_six_default_runs_at_once_all_succeed_and_none_fails(quiet_machine, shared_platform):  # noqa: F811
    # A fresh platform, liveness settings the defaults of config/knobs.py; left running for the Ctrl-C test of
    # tests/security/test_platform_ray.py if this test passes (tests/platform_up.py, SHARED_PLATFORM).
    platform = shared_platform.take()
    log = platform.log()
    max_total = int(re.search(r"slots\s+max_total (\d+)", log).group(1))
    assert max_total >= 1
    api_token = re.search(r"API token (\w+)", log).group(1)
    headers = {"Authorization": f"Token {api_token}"}
    url = platform.url

    before_s = alone(url, headers, "alone-before")
    ids = [submit(url, headers, f"crowd-{i}") for i in range(6)]
    # The second run alone queues behind the crowd, so it is granted when the crowd's last run ends, ahead of the
    # crowd's follow-up evaluations (a lower class), and then runs alone.
    after = submit(url, headers, "alone-after")
    runs = wait_finished(url, headers, ids, 12 * before_s + 600)
    succeeded = sum(r["status"] == "succeeded" for r in runs)
    assert succeeded == 6, [(r["id"], r["status"], r["error"]) for r in runs]
    for r in runs:  # never failed on the way (a reclaim, lost launch or node loss shows as a `failed` status)
        assert "failed" not in statuses_seen(url, headers, r["id"]), r
    after_s = ran_alone_s(url, headers, after)

    t0 = min(at(r, "created_at") for r in runs)
    wall_s = max(at(r, "finished_at") for r in runs) - t0
    serial_s = 6 * (before_s + after_s) / 2
    result = {
        "runs": 6,
        "succeeded": succeeded,
        "wall_s": round(wall_s, 1),
        "serial_s": round(serial_s, 1),
        "alone_s": [round(before_s, 1), round(after_s, 1)],
        "max_total": max_total,
        "ratio": round(wall_s / serial_s, 3),
        # Each crowd run's grant, start (running) and finish, in seconds from the crowd's first submit.
        "timeline": [
            [round(at(r, key) - t0, 1) for key in ("granted_at", "started_at", "finished_at")]
            for r in sorted(runs, key=lambda r: at(r, "granted_at"))
        ],
    }
    Path(RESULTS).write_text(json.dumps(result, indent=2) + "\n")
    spans = result["timeline"]
    # No stall: each run is granted as soon as the one before it ends (or at once, for the first).
    idle = [spans[0][0]] + [later[0] - earlier[2] for earlier, later in zip(spans, spans[1:])]
    assert max(idle) <= IDLE_S, ("idle before a grant", idle, result)
    # No thrash: never more runs held at once than admission allows (and here that is what fits the machine).
    held = [sum(g <= at_ < f for g, _, f in spans) for at_, _, _ in spans]
    assert max(held) <= max_total, ("runs held at once", held, result)
    assert wall_s <= SLOWER_THAN_SERIAL * serial_s, result
    shared_platform.leave(platform)
