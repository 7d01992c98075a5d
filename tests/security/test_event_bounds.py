"""A job's events are typed and bounded (trainer/event_schema.py, runs/telemetry/ingest_validate.py): over its bounds an
event of any type refuses its batch with a 400 naming the event's field and seq; undeclared fields are not stored; a
10 MB batch is a 413; whatever a job posts, its run's board frame stays under 64 KB."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from runs.models import Run, RunEvent, RunStatus
from runs.telemetry.dashboard import board_runs, dashboard_snapshot
from tests.realtime.conftest import gate, run_make, train, user_make
from trainer.event_fields import ENGINES_MAX, IDS_MAX, MAP_MAX, NAME_MAX, NODES_MAX, TEXT_MAX, URL_MAX
from trainer.sample_schema import MAX_SAMPLE_TEXT

pytestmark = pytest.mark.django_db

BOARD_FRAME_MAX = 64 * 1024


def post(run: Run, body, token: str | None = None):
    token = run.ingest_token if token is None else token
    return APIClient().post(f"/api/runs/{run.pk}/ingest/", body, format="json", HTTP_AUTHORIZATION=f"Bearer {token}")


def sample_data(**change) -> dict:
    data = {
        "step": 1,
        "group": 1,
        "index": 0,
        "prompt_index": 3,
        "session": "w0:g1",
        "engine": "engine-0",
        "finish_reason": "stop",
        "pick": "best",
        "prompt": "1 2 3",
        "completion": "4",
        "turns": [{"role": "policy", "text": "4", "version": 0, "engine": "engine-0", "request": "r1"}],
        "reward": 1.0,
        "reward_parts": {"turn_1": 1.0},
        "advantage": 0.5,
        "version_min": 0,
        "version_max": 0,
        "staleness": 0,
        "length": 1,
    }
    return {**data, **change}


def engine(name: str) -> dict:
    return {"engine": name, "state": "open", "version": 0, "active": 0, "waiting": 0, "sessions": 0}


def counts(name: str, admitted: int = 0) -> dict:
    return {"engine": name, "drained": 1, "admitted_at_reopen": admitted}


def agents(**change) -> dict:
    data = {
        "step": 1,
        "sessions": 2,
        "sessions_per_engine": {"engine-0": 2},
        "waiting": 1,
        "requests": 9,
        "tokens": 40,
        "status": {"400": 1, "409": 0, "410": 2, "503": 3},
        "episodes": 8,
        "tool_calls": 5,
        "valid_tool_calls": 4,
        "tool_errors": 1,
        "reward_parts": {"answer": 0.5, "valid_call": 0.75},
    }
    return {**data, **change}


LONG_TEXT, LONG_NAME = "t" * (TEXT_MAX + 1), "n" * (NAME_MAX + 1)
TRAIN = train(0, 1)["data"]
GATE = gate(0)["data"]
VERSION = {"version": 1, "published_at": 1.0, "pause_ms": 1.0}
# One event of each type over one of its bounds, and the field the answer must name.
OVER_BOUNDS = [
    ("status", {"status": "failed", "error": LONG_TEXT}, "data.error"),
    ("gate", {**GATE, "engines": [engine(f"e{i}") for i in range(ENGINES_MAX + 1)]}, "data.engines"),
    ("gate", {**GATE, "engines": [engine(LONG_NAME)]}, "data.engines[0].engine"),
    ("version", {"version": 1, "published_at": 1.0, "pause_ms": 1.0, "drain_ms": "slow"}, "data.drain_ms"),
    ("version", {**VERSION, "drained": -1}, "data.drained"),
    ("version", {**VERSION, "engines": [counts(f"e{i}") for i in range(ENGINES_MAX + 1)]}, "data.engines"),
    ("version", {**VERSION, "engines": [counts("e0", admitted=2**63)]}, "data.engines[0].admitted_at_reopen"),
    ("sampler", {"epoch": 2**63, "group_count": 0, "dataset_size": 1, "consumed_in_epoch": 0}, "data.epoch"),
    ("rollout", {"step": 1, "group_ids": list(range(IDS_MAX + 1))}, "data.group_ids"),
    ("rollout", {"step": 1, "dropped": {f"f{i}": 1 for i in range(MAP_MAX + 1)}}, "data.dropped"),
    ("train", {**TRAIN, "logprob_diff_mean": [0.1] * 1000}, "data.logprob_diff_mean"),
    ("train", {**TRAIN, "epochs": [0] * (IDS_MAX + 1)}, "data.epochs"),
    ("worker", {"event": LONG_NAME}, "data.event"),
    ("checkpoint", {"step": 1, "path": LONG_TEXT}, "data.path"),
    ("log", {"level": "info", "message": LONG_TEXT}, "data.message"),
    ("resources", {"state": "placed", "nodes": ["a"] * (NODES_MAX + 1)}, "data.nodes"),
    ("resources", {"state": "waiting", "detail": LONG_TEXT}, "data.detail"),
    ("sample", sample_data(prompt="p" * (MAX_SAMPLE_TEXT + 1)), "data.prompt"),
    ("control", {"id": 1, "kind": "gate_reset", "outcome": "applied", "detail": LONG_TEXT}, "data.detail"),
    ("serving", {"url": "http://127.0.0.1:8000" + "0" * URL_MAX, "model": "m"}, "data.url"),
    ("serving", {"url": "http://127.0.0.1:8000", "model": LONG_NAME}, "data.model"),
    ("agents", agents(sessions_per_engine={f"e{i}": 1 for i in range(ENGINES_MAX + 1)}), "data.sessions_per_engine"),
    ("agents", agents(sessions_per_engine={LONG_NAME: 1}), f"data.sessions_per_engine.{LONG_NAME[:-1]}..."),
    ("agents", agents(status={"410": -1}), "data.status.410"),
    ("agents", agents(status={"200": 1}), "data.status.200"),
    ("agents", agents(waiting=2**63), "data.waiting"),
    ("agents", agents(tool_errors=1.5), "data.tool_errors"),
    ("agents", agents(reward_parts={"answer": "high"}), "data.reward_parts.answer"),
    ("agents", agents(reward_parts={f"p{i}": 0.0 for i in range(MAP_MAX + 1)}), "data.reward_parts"),
]


@pytest.mark.parametrize(("etype", "data", "field"), OVER_BOUNDS, ids=[f"{t}-{f}" for t, _, f in OVER_BOUNDS])
def test_an_event_over_its_bounds_refuses_the_batch_naming_its_seq_and_field(etype, data, field):
    run = run_make(user_make("ann"))
    response = post(run, [train(1, step=1), {"seq": 7, "type": etype, "data": data}])
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["field"] == f"events[1].{field}"
    assert body["detail"].startswith(f"events[1].{field}: event seq 7: ")
    assert len(body["detail"]) < 300  # the message names the field; it does not echo the posted value
    assert not RunEvent.objects.filter(run=run).exists()  # the valid event of the batch is not stored either


def test_every_event_type_is_tested_over_its_bounds():
    from trainer.events import EVENT_TYPES

    assert {etype for etype, _, _ in OVER_BOUNDS} == EVENT_TYPES


def test_undeclared_fields_are_dropped_and_declared_ones_kept():
    run = run_make(user_make("bea"))
    junk = {"junk": "x" * 10_000, "nested": {"deep": list(range(500))}}
    sampler = {"epoch": 1, "group_count": 2, "dataset_size": 3, "consumed_in_epoch": 2, **junk}
    engines = [{**engine("engine-0"), "kv_rows": 10, "recent_failures": ["x"] * 100}]
    response = post(
        run,
        [
            {"seq": 1, "type": "sampler", "data": sampler},
            {"seq": 2, "type": "gate", "data": {**GATE, "engines": engines, **junk}},
            {"seq": 3, "type": "train", "data": {**TRAIN, "logprob_diff_mean": 0.01, "logprob_diff_max": 0.2, **junk}},
        ],
    )
    assert response.status_code == 200, response.content
    stored = dict(RunEvent.objects.filter(run=run).values_list("type", "data"))
    assert stored["sampler"] == {"epoch": 1, "group_count": 2, "dataset_size": 3, "consumed_in_epoch": 2}
    assert stored["gate"]["engines"] == [engine("engine-0")]
    assert stored["train"] == {**TRAIN, "logprob_diff_mean": 0.01, "logprob_diff_max": 0.2}
    run.refresh_from_db()
    assert "junk" not in run.summary["sampler"] and "junk" not in run.summary["train"]


def test_an_agents_event_is_accepted_and_stored_with_its_declared_fields_only():
    run = run_make(user_make("ada"))
    response = post(run, [{"seq": 1, "type": "agents", "data": {**agents(), "junk": "x" * 1000}}])
    assert response.status_code == 200, response.content
    assert RunEvent.objects.get(run=run, type="agents").data == agents()


def test_an_event_over_the_byte_cap_is_refused_naming_it(settings):
    settings.INGEST_EVENT_MAX_BYTES = 2000
    run = run_make(user_make("cat"))
    big = {"seq": 5, "type": "log", "data": {"level": "info", "message": "m" * 3000}}
    response = post(run, [train(1, step=1), big])
    assert response.status_code == 400
    assert response.json()["field"] == "events[1]"
    assert "event seq 5" in response.json()["detail"] and "at most 2000" in response.json()["detail"]
    assert not RunEvent.objects.filter(run=run).exists()


def test_a_10_mb_batch_answers_413_with_the_limit():
    run = run_make(user_make("dot"))
    message = "m" * TEXT_MAX
    events = [{"seq": i, "type": "log", "data": {"level": "info", "message": message}} for i in range(1, 2600)]
    body = json.dumps({"events": events})
    assert len(body) > 10 * 1000 * 1000
    response = APIClient().post(
        f"/api/runs/{run.pk}/ingest/",
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )
    assert response.status_code == 413
    assert set(response.json()) == {"detail", "limit"}
    assert 0 < response.json()["limit"] < 10 * 1000 * 1000
    assert not RunEvent.objects.filter(run=run).exists()


def hostile_batch(start: int) -> list[dict]:
    """Every type a board row reads, each as big as the schema allows, and undeclared fields besides."""
    junk = {f"k{i}": "x" * 1000 for i in range(20)}
    long_engines = [{**engine(f"{i:0{NAME_MAX}d}"), "poison_reason": LONG_TEXT[:-1]} for i in range(ENGINES_MAX)]
    return [
        {"seq": start, "type": "gate", "data": {**GATE, "state": "poisoned", "engines": long_engines, **junk}},
        {
            "seq": start + 1,
            "type": "sampler",
            "data": {**junk, "epoch": 2**62, "group_count": 1, "dataset_size": 1, "consumed_in_epoch": 1},
        },
        {
            "seq": start + 2,
            "type": "version",
            "data": {"version": 2**62, "published_at": 1e300, "pause_ms": 1.0, **junk},
        },
        {
            "seq": start + 3,
            "type": "train",
            "data": {
                **TRAIN,
                "reward_mean": -1.7976931348623157e308,
                "group_ids": [2**62] * IDS_MAX,
                "epochs": [2**62] * IDS_MAX,
                **junk,
            },
        },
        {"seq": start + 4, "type": "log", "data": {"level": LONG_NAME[:-1], "message": LONG_TEXT[:-1], **junk}},
    ]


def test_the_board_frame_of_a_run_stays_under_64_kb_whatever_its_job_posts():
    owner = user_make("eve", staff=True)
    run = run_make(owner, name="n" * 200)
    for start in range(1, 200, 5):
        response = post(run, hostile_batch(start))
        assert response.status_code == 200, response.content[:300]
    failed = {"seq": 999, "type": "status", "data": {"status": "failed", "error": LONG_TEXT[:-1]}}
    assert post(run, [failed]).status_code == 200
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and len(run.error) > TEXT_MAX  # the longest error a job can leave
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)  # shown among the active rows again
    # A summary written before events were bounded (or by hand): the row still copies only declared fields.
    summary = Run.objects.get(pk=run.pk).summary
    summary["sampler"] = {**summary["sampler"], "huge": "x" * 200_000}
    summary["train"] = {**summary["train"], "step": ["x" * 1000] * 200}
    Run.objects.filter(pk=run.pk).update(summary=summary)

    ((row, _owner, _seq),) = board_runs([run.pk])
    frame = json.dumps({"type": "run.update", "run": row})
    assert len(frame.encode()) < BOARD_FRAME_MAX, len(frame)
    snapshot, _ = dashboard_snapshot(user=owner)
    (active,) = [r for r in snapshot["active"] if r["id"] == run.pk]
    assert len(json.dumps(active).encode()) < BOARD_FRAME_MAX
    assert active["summary"]["train"]["step"] is None and "huge" not in active["summary"]["sampler"]
    assert len(active["reward_history"]) <= 40
