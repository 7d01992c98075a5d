"""Admission matches capacity, end to end (issue 11's acceptance): `make run` on this machine, then six default
runs of 20 steps submitted at once through the API. Every one must succeed without ever failing (none failed,
reclaimed or lost on the way). Liveness settings are the platform's defaults: nothing may die of a busy machine.

`wall_s` (all six) and `serial_s` (six times the wall time of one such run, measured first in the same platform)
go to bench/results/capacity.json with their ratio. A default run uses about 1.5-1.75 of this machine's 2
cores, so admission runs one at a time here and the six take about the serial time: measured 0.83-0.99 quiet,
0.94-1.08 beside the outage test. The test asserts at most SLOWER_THAN_SERIAL times the serial time, a guard
against admission that thrashes or stalls (one run reclaimed and run again costs at least a sixth more); issue 11
stays open on the ratio itself (docs/slots.md).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import REPO_ROOT
from tests.platform_up import up  # noqa: F401 - the fixture that starts and cleans up platform/up.py

RESULTS = REPO_ROOT / "bench" / "results" / "capacity.json"
RUN = {"origin": "api", "kind": "rl_train", "config": {"steps": 20}}
FINISHED = {"succeeded", "failed", "cancelled"}
SLOWER_THAN_SERIAL = 1.15  # the noise on this machine reached 1.08 (beside the outage test)


def submit(url: str, headers: dict[str, str], name: str) -> int:
    reply = requests.post(f"{url}/api/runs/", headers=headers, json={"name": name, **RUN}, timeout=30)
    assert reply.status_code == 201, reply.text
    return int(reply.json()["id"])


def wait_finished(url: str, headers: dict[str, str], ids: list[int], timeout_s: float) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = [requests.get(f"{url}/api/runs/{i}/", headers=headers, timeout=30).json() for i in ids]
        if all(r["status"] in FINISHED for r in runs):
            return runs
        time.sleep(1.0)
    pytest.fail(f"runs {ids} not finished after {timeout_s} s: {[r['status'] for r in runs]}", pytrace=False)


def statuses_seen(url: str, headers: dict[str, str], run_id: int) -> list[str]:
    events = requests.get(f"{url}/api/runs/{run_id}/events/", headers=headers, timeout=30).json()
    return [e["data"]["status"] for e in events if e["type"] == "status"]


@pytest.mark.slow
def test_six_default_runs_at_once_all_succeed_and_none_fails(up):  # noqa: F811 - the imported fixture
    # The defaults of config/knobs.py, stated here because the shared fixture raises the heartbeat timeout.
    platform = up(SLOTS_HEARTBEAT_TIMEOUT_SECONDS="60")
    platform.wait_for(lambda: "The platform is up" in platform.log(), 300, "the banner")
    log = platform.log()
    max_total = int(re.search(r"slots\s+max_total (\d+)", log).group(1))
    assert max_total >= 1
    api_token = re.search(r"API token (\w+)", log).group(1)
    headers = {"Authorization": f"Token {api_token}"}
    url = platform.url

    started = time.monotonic()
    (single,) = wait_finished(url, headers, [submit(url, headers, "single")], 600)
    single_s = time.monotonic() - started
    assert single["status"] == "succeeded", single

    # One after another means each alone: the single run's follow-up evaluation ends before the crowd starts.
    deadline = time.monotonic() + 300
    while requests.get(f"{url}/api/slots/", headers=headers, timeout=30).json()["total"]["running"]:
        assert time.monotonic() < deadline, "the single run's evaluation did not end"
        time.sleep(0.5)

    started = time.monotonic()
    ids = [submit(url, headers, f"crowd-{i}") for i in range(6)]
    runs = wait_finished(url, headers, ids, 6 * single_s + 600)
    wall_s = time.monotonic() - started
    succeeded = sum(r["status"] == "succeeded" for r in runs)
    result = {
        "runs": 6,
        "succeeded": succeeded,
        "wall_s": round(wall_s, 1),
        "serial_s": round(6 * single_s, 1),
        "single_s": round(single_s, 1),
        "max_total": max_total,
        "ratio": round(wall_s / (6 * single_s), 3),
    }
    Path(RESULTS).write_text(json.dumps(result, indent=2) + "\n")
    assert succeeded == 6, [(r["id"], r["status"], r["error"]) for r in runs]
    for r in runs:  # never failed on the way (a reclaim, lost launch or node loss shows as a `failed` status)
        assert "failed" not in statuses_seen(url, headers, r["id"]), r
    assert wall_s <= SLOWER_THAN_SERIAL * 6 * single_s, result
