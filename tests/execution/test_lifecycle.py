"""End to end on real processes: daphne + Celery worker/beat subprocesses on the test PostgreSQL, Redis, and
the shared Ray cluster running the real trainer. A run goes queued -> starting -> running -> succeeded, its
summary shows weight versions and sampler progress, its slot goes to the next run, the platform evaluates the
trained checkpoint as a system run, a cancel stops the job (which checkpoints) and frees the slot, and a
resume continues from that checkpoint as a new attempt."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from django.test import Client

from runs.models import Run, Slot
from runs.scheduling.pace import run_factors
from tests.execution.conftest import TINY_TRAIN_CONFIG, ray_jobs_of_run, wait_for

pytestmark = pytest.mark.slow


def status_history(api, run_id: int) -> list[str]:
    """The run's `status` events: the platform's moves (the job's own reports are `job_status` events)."""
    events = api.get(f"/api/runs/{run_id}/events/?after=0")
    return [e["data"]["status"] for e in events if e["type"] == "status"]


class RunStream(threading.Thread):
    """A browser-like websocket client of /ws/runs/<id>/ that collects events until the run finishes."""

    def __init__(self, web_url: str, run_id: int, cookie: str, timeout: float) -> None:
        super().__init__(daemon=True)
        self.url = f"{web_url.replace('http://', 'ws://')}/ws/runs/{run_id}/?after=0"
        self.cookie, self.timeout = cookie, timeout
        self.snapshot: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []
        self.error: str | None = None

    def run(self) -> None:
        from websockets.sync.client import connect

        deadline = time.monotonic() + self.timeout
        try:
            with connect(
                self.url,
                additional_headers={"Cookie": f"sessionid={self.cookie}"},
                origin="http://127.0.0.1",
                open_timeout=10,
            ) as ws:
                self.snapshot = json.loads(ws.recv(timeout=10))
                while time.monotonic() < deadline:
                    message = json.loads(ws.recv(timeout=max(deadline - time.monotonic(), 0.1)))
                    self.events += message["events"]
                    if any(
                        e["type"] == "status" and e["data"]["status"] in {"succeeded", "failed", "cancelled"}
                        for e in message["events"]
                    ):
                        return
        except Exception as exc:  # noqa: BLE001 - reported by the test's assertion
            self.error = repr(exc)


def session_cookie(username: str, password: str) -> str:
    client = Client()
    assert client.login(username=username, password=password)
    return client.cookies["sessionid"].value


def test_run_succeeds_frees_its_slot_and_is_evaluated(platform, api, ray_cluster):
    platform.start_worker()
    api.patch("/api/settings/concurrency/", {"classes": {"app": {"limit": 1}}})
    first = api.post("/api/runs/", {"name": "first", "origin": "api", "config": TINY_TRAIN_CONFIG}, expect=201)
    # The second run is long: it is cancelled mid-training, resumed, and cancelled again.
    long_config = {**TINY_TRAIN_CONFIG, "steps": 400}
    second = api.post("/api/runs/", {"name": "second", "origin": "api", "config": long_config}, expect=201)
    assert first["status"] == "starting"
    # A websocket client watches the first run live from submission to its final status.
    stream = RunStream(platform.web_url, first["id"], session_cookie("alice", "pw"), timeout=260)
    stream.start()
    assert second["status"] == "queued" and second["pending_reason"] == "class_limit_reached"

    done = api.wait_status(first["id"], {"succeeded", "failed"}, timeout=240, on_timeout=lambda: platform.log("worker"))
    assert done["status"] == "succeeded", done["error"]
    assert status_history(api, first["id"]) == ["queued", "starting", "running", "succeeded"]
    summary = done["summary"]
    steps = TINY_TRAIN_CONFIG["steps"]
    assert summary["version"]["version"] == steps
    assert summary["train"]["step"] == steps
    assert summary["sampler"]["group_count"] >= steps * TINY_TRAIN_CONFIG["prompts_per_step"]
    # Its pace profile is whole (a later run's finish ETA learns from it: runs/scheduling/pace.py).
    marks = summary["progress"]["marks"]
    assert marks[-1][:2] == [10, steps] and run_factors(marks), marks
    # The last gate event is the one after publishing the final version: engines open again at that version.
    assert (summary["gate"]["state"], summary["gate"]["version"]) == ("open", steps), summary["gate"]
    assert len(ray_jobs_of_run(ray_cluster, first["id"])) == 1

    # The websocket delivered the whole stream as stored: every seq once, in order, versions and sampler included.
    stream.join(timeout=30)
    assert stream.error is None and stream.snapshot is not None and stream.snapshot["type"] == "snapshot", (
        stream.error,
        stream.snapshot,
    )
    stored = api.get(f"/api/runs/{first['id']}/events/?after=0")
    assert [e["seq"] for e in stream.events] == [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    streamed_types = {e["type"] for e in stream.events}
    assert {"status", "job_status", "gate", "version", "sampler", "train"} <= streamed_types, streamed_types
    assert [e["data"]["version"] for e in stream.events if e["type"] == "version"][-1] == steps

    # The slot went to the waiting run in the same transaction that finished the first one.
    assert not Slot.objects.filter(run_id=first["id"]).exists()
    nxt = api.wait_status(second["id"], {"starting", "running"}, timeout=30)
    assert nxt["granted_at"] >= done["finished_at"]

    # The platform evaluates the trained checkpoint: a system run owned by the same user, parent = the run.
    # It is submitted right after the finish commits (its own transaction), so wait for it.
    child = wait_for(
        lambda: Run.objects.filter(parent_id=first["id"]).first(),
        timeout=30,
        what="the platform to submit the eval run",
    )
    assert (child.origin, child.run_class, child.kind, child.owner.username) == ("system", "system", "eval", "alice")
    evaluated = api.wait_status(child.pk, {"succeeded", "failed"}, timeout=120)
    assert evaluated["status"] == "succeeded", evaluated["error"]
    assert 0.0 <= evaluated["summary"]["eval"]["held_out_exact_match"] <= 1.0
    assert evaluated["summary"]["eval"]["version"] == steps

    # Cancel: stopping -> the job is signalled (the trainer checkpoints) -> cancelled, slot released.
    api.wait_status(second["id"], "running", timeout=60)
    wait_for(
        lambda: (api.run(second["id"])["summary"].get("version") or {}).get("version", 0) >= 1,
        timeout=90,
        what="a first weight version of the second run",
    )
    api.post(f"/api/runs/{second['id']}/cancel/")
    cancelled = api.wait_status(second["id"], {"cancelled", "failed", "succeeded"}, timeout=60)
    assert cancelled["status"] == "cancelled", cancelled["error"]
    assert status_history(api, second["id"])[-2:] == ["stopping", "cancelled"]
    assert [j.status.value for j in ray_jobs_of_run(ray_cluster, second["id"])] == ["STOPPED"]
    assert not Slot.objects.filter(run_id=second["id"]).exists()
    events = api.get(f"/api/runs/{second['id']}/events/?after=0")
    stop_checkpoint = [e["data"] for e in events if e["type"] == "checkpoint" and e["data"]["reason"] == "stop"]
    assert stop_checkpoint, (
        "the trainer wrote no checkpoint when stopped",
        [(e["type"], e["data"]) for e in events if e["type"] in ("status", "job_status", "log", "checkpoint")],
    )

    # Resume: a new attempt (a new Ray job, with --resume) continues from that checkpoint.
    api.post(f"/api/runs/{second['id']}/resume/")
    api.wait_status(second["id"], "running", timeout=90)

    def restored() -> list[dict]:
        return [
            e["data"]
            for e in api.get(f"/api/runs/{second['id']}/events/?after=0")
            if e["type"] == "checkpoint" and e["data"]["reason"] == "restored"
        ]

    assert [r["step"] for r in wait_for(restored, timeout=90, what="the resumed job to restore")] == [
        stop_checkpoint[-1]["step"]
    ]
    wait_for(
        lambda: api.run(second["id"])["summary"]["version"]["version"] > stop_checkpoint[-1]["step"],
        timeout=90,
        what="training to continue past the checkpoint",
    )
    api.post(f"/api/runs/{second['id']}/cancel/")
    assert api.wait_status(second["id"], {"cancelled", "failed"}, timeout=60)["status"] == "cancelled"
    jobs = sorted(ray_jobs_of_run(ray_cluster, second["id"]), key=lambda j: j.submission_id)
    assert [(j.submission_id.rsplit("-", 1)[1], j.status.value) for j in jobs] == [("0", "STOPPED"), ("1", "STOPPED")]
    assert "--resume" in jobs[1].entrypoint and "--resume" not in jobs[0].entrypoint
