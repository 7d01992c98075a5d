"""The terminal of `make run` (platform/up.py, platform/terminal.py) is quiet: an idle platform prints nothing
after its banner, so the banner stays the last thing on screen; a tick that does something says so; what the
terminal does not show is in var/logs/. Ray is a stand-in that lists one node and answers 404 to everything else (a
job API not there yet): the platform counts it as serving, grants onto that node, and launches wait."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.platform_up import up  # noqa: F401 - the fixture that starts and cleans up up.py

pytestmark = pytest.mark.beside  # its own platforms: in the pytest beside the suite (Makefile)

BANNER_END = "=" * 80
IDLE_SECONDS = 20


# Ray's state API answer for one alive node: the tick reads capacity from it, so runs are granted (and their
# launches then wait for the job API that is not there).
NODES = {
    "result": True,
    "msg": "",
    "data": {
        "result": {
            "result": [
                {
                    "node_id": "stand-in-node",
                    "node_ip": "127.0.0.1",
                    "is_head_node": True,
                    "state": "ALIVE",
                    "state_message": None,
                    "node_name": "127.0.0.1",
                    "resources_total": {"CPU": 2.0, "memory": 8 * 2**30},
                    "labels": {},
                    "start_time_ms": 0,
                    "end_time_ms": 0,
                }
            ],
            "total": 1,
            "num_after_truncation": 1,
            "num_filtered": 1,
            "partial_failure_warning": "",
            "warnings": None,
        }
    },
}


class NotThere(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(NODES).encode() if self.path.startswith("/api/v0/nodes") else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def ray_stand_in():
    server = ThreadingHTTPServer(("127.0.0.1", 0), NotThere)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def wait_until(check, timeout: float, what: str, platform) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert platform.proc.poll() is None, f"up.py exited while waiting for {what}:\n{platform.log()[-4000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{platform.log()[-4000:]}"
        time.sleep(0.5)


def ends_with_banner(text: str) -> bool:
    return text.rstrip().endswith(BANNER_END) and "Ctrl-C stops everything." in text.rstrip().split("\n")[-2]


@pytest.mark.slow
def test_idle_platform_prints_nothing_after_its_banner_and_a_tick_that_acts_says_so(up, ray_stand_in):  # noqa: F811
    platform = up(RAY_ADDRESS=ray_stand_in)
    wait_until(lambda: "The platform is up" in platform.log(), 180, "the banner", platform)
    # Start-up has settled (a late start-up line gets the banner printed again after it): nothing new for 5 s.
    seen, stable_since, deadline = platform.log(), time.monotonic(), time.monotonic() + 90
    while time.monotonic() - stable_since < 5:
        assert time.monotonic() < deadline, f"the terminal never settled:\n{seen[-3000:]}"
        time.sleep(0.5)
        if platform.log() != seen:
            seen, stable_since = platform.log(), time.monotonic()
    assert ends_with_banner(seen), seen[-3000:]

    time.sleep(IDLE_SECONDS)  # about ten ticks of the beat
    after = platform.log()[len(seen) :]
    assert after == "", f"an idle platform printed after its banner:\n{after[:3000]}"
    assert ends_with_banner(platform.log())
    # Hidden, not lost: Redis's start-up notices are in var/logs/redis.log, not on the terminal.
    assert "Ready to accept connections" in (platform.var_dir / "logs" / "redis.log").read_text()
    assert "Ready to accept connections" not in seen
    assert "Task runs.tasks.tick" not in seen and "Sending due task" not in seen

    # The ticks did run all along: one that acts (a run past its time limit; its launch waits for Ray) says so.
    token = re.search(r"API token (\w+)", seen).group(1)
    response = requests.post(
        f"{platform.url}/api/runs/",
        headers={"Authorization": f"Token {token}"},
        timeout=30,
        json={"name": "limit", "origin": "api", "kind": "rl_train", "config": {"steps": 5}, "time_limit_seconds": 1},
    )
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    wait_until(lambda: re.search(rf"tick: timed_out \[{run_id}\]", platform.log()), 60, "the tick's line", platform)


def test_torch_finds_numpy_so_ray_actors_do_not_warn():
    """torch warns "Failed to initialize NumPy" at import when numpy is missing; every Ray actor imports it."""
    result = subprocess.run(
        [sys.executable, "-W", "default", "-c", "import torch; print(torch.zeros(2).numpy())"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "NumPy" not in result.stderr, result.stderr
