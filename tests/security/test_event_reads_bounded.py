"""Compare and trace of a run holding 100,000 hostile events answer within 2 s and 200 MB (runs/telemetry/compare.py
reads at most COMPARE_POINTS_MAX train events per run, runs/telemetry/trace.py the latest TRACE_READ_MAX traced events,
both only declared fields). The rows are bulk-created, as a job's events stored over a long run would be."""

from __future__ import annotations

import json
import time
import tracemalloc
from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from runs.models import Run, RunEvent, RunStatus
from runs.telemetry.compare import run_compare
from runs.telemetry.trace import run_trace
from trainer.event_fields import ENGINES_MAX, HISTOGRAM_BUCKETS_MAX, IDS_MAX, NAME_MAX, PHASES_MAX, TEXT_MAX

pytestmark = pytest.mark.django_db

EVENTS = 100_000
SECONDS_MAX = 2.0
MEMORY_MAX = 200 * 1024 * 1024
BIG = -1.2345678901234567e-300  # the longest a finite number prints


def span(t: float) -> dict:
    return {"start": t, "end": t + 0.123456789012345}


def names(prefix: str) -> list[str]:
    return [f"{prefix}{i}".ljust(NAME_MAX, "x") for i in range(ENGINES_MAX)]


def hostile(i: int, t: float) -> tuple[str, dict]:
    """Event i of the run, each of its fields at its bound. The bulky lists and maps are at their bounds on some
    events only (span maps every 20th, ids, histograms and gate engines every 1000th): on all 100,000 they would
    be gigabytes."""
    kind = i % 10
    if kind < 6:
        data = {k: BIG for k in ("loss", "reward_mean", "exact_match", "kl", "entropy", "pg_loss", "clip_frac")}
        data.update({k: BIG for k in ("grad_norm", "filtered_rate", "train_seconds", "elapsed_s", "samples_per_s")})
        data.update({k: BIG for k in ("gate_closed_share", "train_reward", "held_out_reward", "logprob_diff_max")})
        data.update(step=i, steps_total=2**62, staleness_max=2**62, groups=2**62, span=span(t), eval_span=span(t))
        if i % 1000 == 0:
            data.update(group_ids=[2**62] * IDS_MAX, epochs=[2**62] * IDS_MAX)
            edges = [BIG * k for k in range(HISTOGRAM_BUCKETS_MAX + 1)]
            data["histograms"] = {
                f"h{j}": {"edges": edges, "counts": [2**62] * HISTOGRAM_BUCKETS_MAX} for j in range(4)
            }
        return "train", data
    if kind < 8:
        data = {"step": i, "span": span(t), "reward_mean": BIG, "seconds": BIG, "engines": names("engine")[:4]}
        if i % 20 == 6:
            data["spans"] = {"workers": {n: span(t) for n in names("w")}, "engines": {n: span(t) for n in names("e")}}
        return "rollout", data
    if kind == 8:
        phases = {f"phase{j}".ljust(NAME_MAX, "x"): span(t) for j in range(PHASES_MAX)}
        return "version", {"version": 2**62, "published_at": t, "pause_ms": BIG, "drain_ms": BIG, "phases": phases}
    engines = [{"engine": n, "state": "poisoned", "poison_reason": "p" * TEXT_MAX} for n in names("e")]
    return "gate", {"state": "p" * NAME_MAX, "version": 2**62, "active": 2**62, "waiting": 2**62,
                    "engines": engines if i % 1000 == 9 else engines[:1]}  # fmt: skip


# The events hostile() makes, by the residue of i that picks each shape (the first that matches wins; i: an
# event of that shape): on
# PostgreSQL the rows are made by the database from one template per shape (`step` set to i), which takes seconds
# where 100,000 inserts from Python take minutes.
SHAPES = [(1000, 0, 1000), (1000, 9, 9), (20, 6, 6)] + [(10, r, 10 + r) for r in range(10)]  # (modulus, residue, i)


def insert_postgresql(run: Run, t0: float) -> None:
    cases = []
    params: list = []
    for modulus, residue, i in SHAPES:
        etype, data = hostile(i, t0)
        cases.append(f"WHEN mod(g, {modulus}) = {residue} THEN %s")
        params.append(json.dumps({"type": etype, "data": data}))
    shape = f"(CASE {' '.join(cases)} END)::jsonb"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""INSERT INTO runs_runevent (run_id, seq, source, source_seq, ts, type, data)
            SELECT %s, g, 'attempt-0', g, to_timestamp(%s + g), s ->> 'type',
                   CASE WHEN s -> 'data' ? 'step' THEN jsonb_set(s -> 'data', '{{step}}', to_jsonb(g))
                   ELSE s -> 'data' END
            FROM generate_series(1, %s) AS g, LATERAL (SELECT {shape} AS s) AS shaped""",
            [run.pk, t0, EVENTS, *params],
        )


@pytest.fixture
def hostile_run():
    owner = get_user_model().objects.create_user(username="mallory", password="pw")
    run = Run.objects.create(
        name="m" * 200, origin="api", run_class="app", kind="rl_train", owner=owner, status=RunStatus.RUNNING
    )
    t0 = time.time()
    if connection.vendor == "postgresql":
        insert_postgresql(run, t0)
    else:
        batch: list[RunEvent] = []
        for i in range(1, EVENTS + 1):
            etype, data = hostile(i, t0 + i)
            ts = datetime.fromtimestamp(t0 + i, tz=UTC)
            batch.append(RunEvent(run=run, seq=i, source="attempt-0", source_seq=i, ts=ts, type=etype, data=data))
            if len(batch) == 5000:
                RunEvent.objects.bulk_create(batch)
                batch = []
    Run.objects.filter(pk=run.pk).update(last_seq=EVENTS)
    return owner, Run.objects.get(pk=run.pk)


def measured(read) -> tuple[float, int, int]:
    """(seconds, bytes of its JSON, peak bytes traced) of one read rendered as JSON, timed without tracing."""
    started = time.perf_counter()
    size = len(json.dumps(read()))
    seconds = time.perf_counter() - started
    tracemalloc.start()
    try:
        json.dumps(read())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return seconds, size, peak


def test_compare_and_trace_of_100000_hostile_events_are_bounded(hostile_run):
    owner, run = hostile_run
    assert RunEvent.objects.filter(run=run).count() == EVENTS

    seconds, size, peak = measured(lambda: run_compare(user=owner, run_ids=[run.pk]))
    assert seconds < SECONDS_MAX and peak < MEMORY_MAX, (seconds, size, peak)
    compared = run_compare(user=owner, run_ids=[run.pk])["runs"][0]
    assert compared["steps"] == 60_000 and len(compared["step"]) <= 1000
    assert "histograms" not in compared["metrics"] and len(compared["metrics"]) <= 25

    seconds, size, peak = measured(lambda: run_trace(run=run))
    assert seconds < SECONDS_MAX and peak < MEMORY_MAX, (seconds, size, peak)
    trace = run_trace(run=run)
    assert trace["otherData"]["truncated"] is True  # the oldest events are left out, and it says so
    tracks = [e for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"]
    assert len(tracks) <= 4 + 2 * ENGINES_MAX
