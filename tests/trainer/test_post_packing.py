"""The HTTP sink's posts fit the platform's caps on one ingest post, and one refused event loses only itself:
packing as pure logic, then a backlog of real-size train events through a live platform ingest."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tests.realtime.conftest import run_make, user_make
from trainer.post_packing import POST_MAX_BYTES, POST_MAX_VALUES, json_values, next_post, refused_event
from trainer.sinks import EventEmitter, HttpSink


def _train_data(step: int) -> dict[str, Any]:
    """A train event as big as the trainer makes them: every histogram at its full 64 buckets."""
    rng = random.Random(step)
    edges = sorted(rng.uniform(-3, 3) for _ in range(65))
    hist = {"edges": edges, "counts": [rng.randint(0, 900) for _ in range(64)]}
    return {
        "step": step,
        "loss": rng.random(),
        "reward_mean": rng.random(),
        "exact_match": rng.random(),
        "kl": rng.random(),
        "entropy": rng.random(),
        "staleness_max": 0,
        "histograms": {k: hist for k in ("reward", "advantage", "response_length", "staleness")},
    }


def test_json_values_counts_containers_and_leaves() -> None:
    assert json_values({"a": [1, 2, {"b": None}], "c": "x"}) == 7


def test_a_post_stays_within_every_budget_and_always_takes_one() -> None:
    events = [{"seq": i, "type": "train", "data": _train_data(i)} for i in range(1, 301)]
    cut = next_post(events)
    assert 0 < cut < 300
    assert sum(json_values(e) for e in events[:cut]) <= POST_MAX_VALUES
    assert next_post(events, max_events=3) == 3
    huge = [{"seq": 1, "type": "log", "data": {"message": "x" * (POST_MAX_BYTES + 1)}}, *events]
    assert next_post(huge) == 1  # alone over the budget: it goes alone, the platform judges it
    assert next_post([]) == 0


def test_refused_event_reads_the_field_of_a_400_only() -> None:
    assert refused_event(400, {"detail": "event seq 9: ...", "field": "events[2].data.nodes[0]"}, 5) == 2
    assert refused_event(400, {"field": "events[7]"}, 5) is None  # not in this post
    assert refused_event(400, {"field": "events"}, 5) is None
    assert refused_event(413, {"field": "events[1]"}, 5) is None
    assert refused_event(400, None, 5) is None


@pytest.mark.django_db(transaction=True)
def test_a_backlog_of_full_train_events_lands_whole_and_a_refused_event_costs_only_itself(live_server, settings):
    """300 train events at their largest, written while the sink could not post (as after an outage), are well
    over the platform's 50,000 values per post as one body; every one is stored. An event over the platform's
    per-event byte cap (here lowered to 8,000 bytes, above any of the train events) is refused alone: the events
    around it are stored."""
    settings.INGEST_EVENT_MAX_BYTES = 8000
    run = run_make(user_make("packer"))
    url = f"{live_server.url}/api/runs/{run.pk}/ingest/"
    sink = HttpSink(url, token=run.ingest_token, flush_interval_s=60.0, heartbeat_s=3600.0)
    emitter = EventEmitter([sink])
    with sink._cond:  # hold the post thread off until the backlog is written, as a platform outage would
        for step in range(1, 301):
            emitter.emit("train", _train_data(step))
        emitter.emit("checkpoint", {"step": 300, "path": "p" * 4000, "error": "e" * 4000})
        emitter.emit("train", _train_data(301))
        assert sum(json_values(e) for e in sink._buf) > 50_000
        sizes = [len(json.dumps(e, separators=(",", ":"))) for e in sink._buf]
        assert max(sizes[:300]) < 8000 < sizes[300]
    emitter.close(timeout_s=60)
    stored = list(run.events.order_by("seq").values_list("source_seq", "type"))
    assert [seq for seq, _ in stored] == [*range(1, 301), 302]
    assert sink.delivered == 301 and sink.dropped == 1
