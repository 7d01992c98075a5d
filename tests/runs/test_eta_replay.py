"""Finish ETA: replay of recorded event streams of real training runs, and the arithmetic of
runs/scheduling/progress.py.

The streams were recorded by tests/runs/fixtures/record_eta_streams.py on an idle machine: each run alone, its
CPU share checked (a run that shared the machine is recorded again). tests/runs/fixtures/eta_streams.json holds
25 local-mode runs (one process) of varied tasks, sizes and lengths; eta_streams_ray.json 25 runs in the
platform's mode (colocated, on Ray). They go through the ingest's own summary fold and the run JSON's
`progress_of`, as a running run's events would. At the first train event at or past 10% progress, the predicted
finish is compared with the recorded one, with the recent step rate alone and with the pace factors of the
streams recorded before it (runs/scheduling/pace.py: the platform reads the latest finished runs of the kind).

Measured (2026-12-01), within +-20% (the issue asks for 80%):

| streams | recent rate alone | with the pace of earlier runs |
|---|---|---|
| platform mode (25) | 13 (52%), median error 19.8%, 22 too long | 22 (88%), median error 9.7% |
| local mode (25) | 19 (76%), median error 10.2% | 19 (76%), median error 12.7% |

Platform-mode runs speed up as their zero-variance groups (filtered, sampled again) get rarer: in the default
run the filtered share fell from 46% to 25% and the rollout time with it, 0.85 s to 0.6 s a step. The local-mode
misses are runs whose pace changes after their first 10% in their own way (e.g. h2, 250 steps, took 41% less
time per step over its last 90%), and short runs judged on two or three step intervals (e3, 30 steps, at step
3: +4% and then +48% on two recordings in a row). Windows of 5 to 20 steps, a median of step times and the last
half of the run all gave 18-20 of 25 there. The tests pin the measured numbers (a regression guard).
"""

from __future__ import annotations

import json
import statistics
from datetime import UTC, datetime
from pathlib import Path

from runs.models import Run, RunEvent, RunStatus
from runs.scheduling.finishes import PACE_SAMPLE, progress_of
from runs.scheduling.pace import pace_factors
from runs.scheduling.progress import evals_left, progress_fold, queue_starts, run_progress
from runs.telemetry.ingest import summary_fold

FIXTURE = Path(__file__).parent / "fixtures" / "eta_streams.json"
TOLERANCE = 0.2  # the issue's +-20%
WITHIN = 0.76  # share of the runs whose finish ETA after 10% progress is within TOLERANCE (measured; the issue: 0.8)
RAY_FIXTURE = FIXTURE.with_name("eta_streams_ray.json")
WITHIN_LEARNED = 0.88  # the same on the platform-mode streams, with the pace of earlier runs (measured: 22 of 25)


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def events(stream: dict):
    """Each train event of the stream as the ingest gets it, with its time since the run's first event."""
    t0, config = stream["first_event_ts"], stream["config"]
    for t, step, train_seconds, eval_seconds in stream["train"]:
        data = {"step": step, "steps_total": config["steps"], "train_seconds": train_seconds}
        if eval_seconds:
            data["eval_span"] = {"start": t0 + t - eval_seconds, "end": t0 + t}
        yield t, RunEvent(type="train", data=data, ts=at(t0 + t))


def replay(stream: dict, pace: dict[int, float] | None = None) -> tuple[float, float]:
    """(predicted, actual) seconds to the finish at the first train event at or past 10% progress; `pace`: the
    factors of the finished runs before it (none: the recent step rate alone)."""
    run = Run(status=RunStatus.RUNNING, config=stream["config"], summary={})
    for t, event in events(stream):
        run.summary = summary_fold(run.summary, [event])
        estimate = progress_of(run, now=event.ts, paces={run.kind: pace or {}})
        if estimate.progress is not None and estimate.progress >= 0.1 and estimate.eta_finish_seconds is not None:
            return estimate.eta_finish_seconds, stream["finished_s"] - t
    raise AssertionError(f"{stream['name']}: no finish ETA by the end of the run")


def profile(stream: dict) -> list:
    """The pace profile (`marks`) the whole stream leaves in its run's summary."""
    return summary_fold({}, [event for _, event in events(stream)])["progress"]["marks"]


def replay_errors(streams: list[dict], *, learned: bool) -> dict[str, float]:
    """Each stream's relative ETA error at 10%; `learned`: with the pace of the streams recorded before it, the
    latest PACE_SAMPLE of them (as the platform reads the latest finished runs), none for the first ones."""
    errors = {}
    profiles = [profile(s) for s in streams] if learned else []
    for i, stream in enumerate(streams):
        earlier = profiles[max(0, i - PACE_SAMPLE) : i][::-1]
        predicted, actual = replay(stream, pace_factors(earlier) if learned else None)
        assert predicted > 0 and actual > 0
        errors[stream["name"]] = predicted / actual - 1
    return errors


def recorded(fixture: Path) -> list[dict]:
    streams = json.loads(fixture.read_text())["streams"]
    for stream in streams:  # one run per stream: its steps 1..n, once each (the recorder checks it too)
        assert [row[1] for row in stream["train"]] == list(range(1, len(stream["train"]) + 1)), stream["name"]
    return streams


def score(errors: dict[str, float]) -> tuple[float, float, dict[str, float]]:
    """(share within TOLERANCE, median absolute error, the errors rounded for a failure's message)."""
    within = sum(abs(e) <= TOLERANCE for e in errors.values()) / len(errors)
    return within, statistics.median(abs(e) for e in errors.values()), {n: round(e, 3) for n, e in errors.items()}


def test_replay_of_recorded_runs():
    streams = recorded(FIXTURE)
    assert len(streams) >= 20
    within, median_error, report = score(replay_errors(streams, learned=False))
    assert within >= WITHIN, report
    assert median_error <= 0.12, report  # measured 0.102
    # With the pace of the streams before each: the same 19 of 25 (these runs differ in task, size and length,
    # and their pace changes are mostly noise of a few steps), median error 12.7%.
    within, median_error, report = score(replay_errors(streams, learned=True))
    assert within >= WITHIN, report
    assert median_error <= 0.14, report  # measured 0.127


def test_replay_of_platform_mode_runs_learns_their_pace():
    """The platform's own mode (Ray actors, colocated; tests/runs/fixtures/eta_streams_ray.json): its runs
    speed up as their zero-variance groups get rarer, so the recent step rate alone is too long at 10% (13 of 25
    within +-20%, 22 too long, median error 19.8%). With the pace of the runs before it: 22 of 25, median 9.7%.
    r17-r25 were recorded after the estimator was written and scored on r1-r16 (14 of 16): 8 of their 9 hold."""
    streams = recorded(RAY_FIXTURE)
    assert len(streams) >= 25
    plain_within, plain_median, plain = score(replay_errors(streams, learned=False))
    within, median_error, report = score(replay_errors(streams, learned=True))
    assert within >= WITHIN_LEARNED, (report, plain)
    assert median_error <= 0.1, report  # measured 0.097
    assert within > plain_within and median_error < plain_median, (report, plain)  # measured 13/25, 0.198


# --- the arithmetic, on made-up numbers ------------------------------------------------------------------


def test_steady_pace_predicts_the_finish_exactly():
    # 2 s per step, an evaluation of 5 s every 10 steps, 100 steps: step 20 at t=50 (2 evals done).
    progress = None
    for step in range(1, 21):
        t = 2.0 * step + 5.0 * (step // 10)
        data = {"step": step, "steps_total": 100}
        if step % 10 == 0:
            data["eval_span"] = {"start": t - 5.0, "end": t}
        progress = progress_fold(progress, train=data, ts=t)
    got = run_progress(
        summary={"train": {"step": 20, "steps_total": 100}, "progress": progress},
        config={"eval_every": 10},
        defaults={"steps": 400, "eval_every": 10},
        now=50.0,
    )
    assert got.progress == 0.2
    assert got.eta_finish_seconds == 80 * 2.0 + 8 * 5.0


def test_a_deadline_caps_the_eta_and_no_rate_means_no_eta():
    progress = progress_fold(None, train={"step": 1}, ts=0.0)
    summary = {"train": {"step": 1, "steps_total": 10}, "progress": progress}
    assert run_progress(summary=summary, config={}, defaults={"steps": 10}, now=0.0).eta_finish_seconds is None
    progress = progress_fold(progress, train={"step": 2}, ts=10.0)
    summary = {"train": {"step": 2, "steps_total": 10}, "progress": progress}
    free = run_progress(summary=summary, config={"eval_every": 0}, defaults={"steps": 10}, now=10.0)
    assert free.eta_finish_seconds == 80.0
    capped = run_progress(summary=summary, config={"eval_every": 0}, defaults={"steps": 10}, now=10.0, deadline=30.0)
    assert capped.eta_finish_seconds == 20.0


def test_a_resumed_run_starts_a_new_window():
    progress = progress_fold(None, train={"step": 5}, ts=0.0)
    progress = progress_fold(progress, train={"step": 6}, ts=1.0)
    progress = progress_fold(progress, train={"step": 4}, ts=100.0)  # resumed from a checkpoint at step 3
    assert progress["points"] == [[100.0, 4.0, 0.0]]


def test_evaluations_left():
    assert evals_left(20, 100, 10) == 8
    assert evals_left(20, 105, 10) == 9  # the last step evaluates too
    assert evals_left(100, 100, 10) == 0 and evals_left(5, 100, 0) == 0


def test_queue_starts_chain_the_finishes():
    # Two held runs finish at 10 and 30; a typical run takes 100 s.
    assert queue_starts(finishes=[30.0, 10.0], run_seconds=100.0, now=0.0, positions=4) == [10.0, 30.0, 110.0, 130.0]
    assert queue_starts(finishes=[10.0], run_seconds=None, now=0.0, positions=2) == [10.0, None]
    assert queue_starts(finishes=[-5.0], run_seconds=None, now=0.0, positions=1) == [0.0]  # overdue: now
