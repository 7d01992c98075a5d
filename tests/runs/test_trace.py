"""GET /api/runs/<id>/trace/: a finished run's stored events as Chrome trace JSON. The run is real: the trainer
CLI trains it (local mode) and its events go through the real ingest into PostgreSQL, the final status event
finishing the run; the trace's publication spans are then checked against the gate events in the database."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from runs.models import RunEvent, RunStatus
from tests.runs.test_services import submit
from tests.trainer.test_cli import read_events, trainer_cli, write_config

pytestmark = pytest.mark.django_db

# Trace Event Format: the keys each phase must carry (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU).
REQUIRED = {"X": {"name", "ph", "ts", "dur", "pid", "tid"}, "i": {"name", "ph", "ts", "pid", "tid", "s"}}
REQUIRED["M"] = {"name", "ph", "pid", "args"}
TRANSITION_PATH = ("queued", "starting", "running", "succeeded")  # a run that trains and succeeds


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> list[dict]:
    """A real training run's events: 4 steps, evaluations every 2, a final checkpoint."""
    tmp = tmp_path_factory.mktemp("trace")
    config = write_config(tmp, steps=4, eval_every=2, eval_prompts=8, num_workers=2)
    done = trainer_cli(
        "run", "--config", str(config), "--events", str(tmp / "events.jsonl"), "--checkpoint-dir", str(tmp / "ck")
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return read_events(tmp / "events.jsonl")


def ingest(run, events: list[dict], django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = APIClient().post(
            f"/api/runs/{run.pk}/ingest/", events, format="json", HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}"
        )
    assert response.status_code == 200, response.content


def check_trace_format(trace: dict) -> None:
    assert set(trace) >= {"traceEvents", "displayTimeUnit"} and trace["displayTimeUnit"] in ("ms", "ns")
    json.loads(json.dumps(trace, allow_nan=False))  # strict JSON: no NaN or Infinity
    for event in trace["traceEvents"]:
        assert event["ph"] in REQUIRED, event
        assert REQUIRED[event["ph"]] <= event.keys(), event
        assert isinstance(event["pid"], int) and isinstance(event.get("tid", 0), int)
        if event["ph"] == "X":
            assert isinstance(event["ts"], float) and event["dur"] >= 0
        if event["ph"] == "i":
            assert event["s"] in ("t", "p", "g")


def test_trace_of_a_finished_run(recorded, user, other_user, handoffs, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        run = submit(user, origin="api")
    ingest(run, recorded, django_capture_on_commit_callbacks)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED

    owner = APIClient()
    owner.force_authenticate(user)
    response = owner.get(f"/api/runs/{run.pk}/trace/")
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-trace.json"'
    trace = json.loads(response.content)
    check_trace_format(trace)

    events = trace["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"driver", "learner", "gate"} <= set(tracks.values())
    assert any(n.startswith("engine-") for n in tracks.values())
    assert {"worker-0", "worker-1"} & set(tracks.values())
    spans = [e for e in events if e["ph"] == "X"]
    learner = {e["name"] for e in spans if tracks[e["tid"]] == "learner"}
    assert {f"train step {s}" for s in range(1, 5)} <= learner
    assert {"eval step 2", "eval step 4", "checkpoint step 4"} <= learner

    # Publication spans agree with the gate events in the database.
    t0 = trace["otherData"]["epoch_start_s"]
    gate_tid = next(t for t, n in tracks.items() if n == "gate")
    publishes = sorted(
        (e for e in spans if e["tid"] == gate_tid and e["name"].startswith("publish v")), key=lambda e: e["ts"]
    )
    stages = [e for e in spans if e["tid"] == gate_tid and not e["name"].startswith("publish v")]
    rows = list(RunEvent.objects.filter(run=run, type__in=["gate", "version"]).order_by("seq"))
    versions = [r for r in rows if r.type == "version"]
    assert [e["args"]["version"] for e in publishes] == [r.data["version"] for r in versions] == [1, 2, 3, 4]
    assert len(stages) == 4 * len(publishes)
    for publish, row in zip(publishes, versions):
        v = row.data["version"]
        start, end = t0 + publish["ts"] / 1e6, t0 + (publish["ts"] + publish["dur"]) / 1e6
        mine = [e for e in stages if e["name"].endswith(f" v{v}")]
        assert [e["name"].split()[0] for e in sorted(mine, key=lambda e: e["ts"])] == [
            "seal",
            "drain",
            "install",
            "reopen",
        ]
        assert all(publish["ts"] <= e["ts"] and e["ts"] + e["dur"] <= publish["ts"] + publish["dur"] + 1 for e in mine)
        # The gate event after the publication: the gate is open at the new version, reported after reopen ended.
        after = next(r for r in rows if r.seq > row.seq and r.type == "gate")
        assert after.data["state"] == "open" and after.data["version"] == v
        assert after.ts.timestamp() >= end - 1e-3
        # The gate event before it (the previous publication's reopen, or the start) came before the seal.
        before = [r for r in rows if r.seq < row.seq and r.type == "gate"]
        assert before and before[-1].ts.timestamp() <= start + 1e-3
    instants = [e for e in events if e["ph"] == "i" and e["tid"] == gate_tid]
    assert len(instants) == sum(1 for r in rows if r.type == "gate")
    # The driver track draws each platform move once (`status X`) and the job's own reports apart (`job X`).
    driver = [e["name"] for e in events if e["ph"] == "i" and tracks[e["tid"]] == "driver"]
    assert [n for n in driver if n.startswith("status ")] == [f"status {s}" for s in TRANSITION_PATH]
    assert [n for n in driver if n.startswith("job ")] == ["job running", "job succeeded"]

    stranger = APIClient()
    stranger.force_authenticate(other_user)
    assert stranger.get(f"/api/runs/{run.pk}/trace/").status_code == 404
    assert APIClient().get(f"/api/runs/{run.pk}/trace/").status_code in (401, 403)


def test_a_run_without_events_has_an_empty_trace(user, handoffs):
    run = submit(user, origin="api")
    client = APIClient()
    client.force_authenticate(user)
    trace = client.get(f"/api/runs/{run.pk}/trace/").json()
    check_trace_format(trace)
    assert [e["name"] for e in trace["traceEvents"] if e["ph"] == "i"] == ["status queued", "status starting"]


def test_malformed_spans_are_refused_at_ingest(user, handoffs, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        run = submit(user, origin="api")
    bad = {"seq": 1, "type": "version", "data": {"version": 1, "published_at": 1.0, "pause_ms": 1.0}}
    bad["data"]["phases"] = {"seal": {"start": 5.0, "end": 4.0}}
    response = APIClient().post(
        f"/api/runs/{run.pk}/ingest/", [bad], format="json", HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}"
    )
    assert response.status_code == 400
    assert response.json()["field"] == "events[0].data.phases.seal" and "event seq 1" in response.json()["detail"]


def test_a_job_cannot_make_unbounded_tracks():
    from runs.models import Run
    from runs.telemetry.trace import MAX_TRACKS_PER_KIND, trace_from_events

    engines = {f"engine-{i}": {"start": 1.0, "end": 2.0} for i in range(MAX_TRACKS_PER_KIND + 50)}
    data = {"step": 1, "spans": {"engines": engines, "workers": {}}}
    trace = trace_from_events(Run(pk=7, name="many"), [(1, 1.0, "rollout", data)])
    check_trace_format(trace)
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert len([n for n in names if n.startswith("engine-")]) == MAX_TRACKS_PER_KIND and "other" in names
    assert sum(1 for e in trace["traceEvents"] if e["ph"] == "X") == MAX_TRACKS_PER_KIND + 50


def test_the_startup_track_says_where_the_time_before_training_went(user):
    """Queued, launch (grant to the job's first `resources` event), placement (`waiting` to `placed`), process
    start (`placed` to `ready`); a requeue starts the phases over, and a job's own reports of its state
    (`job_status`) end nothing."""
    from runs.telemetry.trace import trace_from_events

    with_status = lambda seq, ts, status, previous: (seq, ts, "status", {"status": status, "previous": previous})  # noqa: E731
    events = [
        with_status(1, 100.0, "queued", None),
        with_status(2, 102.0, "starting", "queued"),
        (3, 106.0, "resources", {"state": "waiting"}),
        (4, 116.0, "resources", {"state": "timeout"}),
        with_status(5, 116.5, "queued", "starting"),  # requeued: a new wait, a new attempt
        with_status(6, 117.0, "starting", "queued"),
        (7, 121.0, "resources", {"state": "waiting"}),
        (8, 121.1, "resources", {"state": "placed"}),
        (9, 121.2, "job_status", {"status": "running", "version": 0}),  # the job's report, not a move
        (10, 128.6, "resources", {"state": "ready"}),
        with_status(11, 128.7, "running", "starting"),
    ]
    trace = trace_from_events(submit(user, origin="api"), events)
    check_trace_format(trace)
    tracks = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    startup = [
        (e["name"], e["ts"] / 1e6, round((e["ts"] + e["dur"]) / 1e6, 3))
        for e in trace["traceEvents"]
        if e["ph"] == "X" and tracks[e["tid"]] == "startup"
    ]
    assert startup == [
        ("queued", 0.0, 2.0),
        ("launch", 2.0, 6.0),
        ("placement", 6.0, 16.0),
        ("queued", 16.5, 17.0),
        ("launch", 17.0, 21.0),
        ("placement", 21.0, 21.1),
        ("process start", 21.1, 28.6),
    ]
