"""Pace profiles (runs/scheduling/pace.py): what the summary keeps of a run's pace, the factors finished runs give, and
a running run's ETA corrected by the latest finished runs of its kind, read from the database."""

from __future__ import annotations

import pytest
from django.utils import timezone

from runs.models import Run, RunStatus
from runs.scheduling.finishes import pace_of, progress_of
from runs.scheduling.pace import FACTOR_MAX, PACE_MIN_RUNS, factor_at, marks_fold, pace_factors, run_factors
from runs.scheduling.progress import progress_fold, run_progress
from tests.runs.test_services import submit


def fold(seconds_per_step, total: int, *, t0: float = 0.0, evals: dict[int, float] | None = None) -> dict:
    """The summary's `progress` after steps 1..total, step s taking seconds_per_step(s) (plus its evaluation)."""
    progress, t = None, t0
    for step in range(1, total + 1):
        t += seconds_per_step(step) if step > 1 else 0.0
        data: dict = {"step": step, "steps_total": total}
        if evals and step in evals:
            t += evals[step]
            data["eval_span"] = {"start": t - evals[step], "end": t}
        progress = progress_fold(progress, train=data, ts=t)
    return progress


def test_the_summary_keeps_one_mark_per_tenth_and_its_clock_leaves_evaluations_out():
    progress = fold(lambda s: 2.0, 40, evals={10: 30.0, 20: 30.0})
    assert [m[0] for m in progress["marks"]] == list(range(11))
    assert [m[1] for m in progress["marks"]] == [1, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40]
    assert progress["clock"] == 78.0  # 39 steps of 2 s; the two 30 s evaluations are not training time
    assert progress["marks"][-1] == [10, 40, 78.0]


def test_a_resumed_run_starts_its_profile_again():
    marks = marks_fold(None, step=1, total=10, clock=0.0, restarted=False)
    marks = marks_fold(marks, step=5, total=10, clock=8.0, restarted=False)
    assert marks == [[1, 1, 0.0], [5, 5, 8.0]]
    assert marks_fold(marks, step=3, total=10, clock=0.0, restarted=True) == [[3, 3, 0.0]]
    assert marks_fold(marks, step=6, total=None, clock=9.0, restarted=False) == marks  # no total: nothing added


def test_hostile_train_numbers_leave_the_profile_as_it_was():
    # A job posts its own numbers: a step past any float tenth, a negative step, no total, not a number.
    progress = fold(lambda s: 1.0, 4)
    for train in (
        {"step": 1e308, "steps_total": 1e-300},
        {"step": 1e300, "steps_total": -1},
        {"step": 5, "steps_total": 0},
        {"step": "5", "steps_total": 10},
        {"step": True, "steps_total": 10},
    ):
        assert progress_fold(progress, train=train, ts=10.0)["marks"] == progress["marks"], train
    resumed = progress_fold(progress, train={"step": -7, "steps_total": 10}, ts=10.0)  # going back: a restart
    assert resumed["marks"] == [[0, -7.0, 0.0]] and run_factors(resumed["marks"]) == {}


def test_a_run_that_speeds_up_after_its_first_tenth_has_a_factor_below_one():
    # 2 s per step for the first 10 steps of 100, then 1 s: after tenth 1 it runs at half the pace before.
    progress = fold(lambda s: 2.0 if s <= 10 else 1.0, 100)
    factors = run_factors(progress["marks"])
    assert factors[1] == pytest.approx(0.5, abs=0.02)
    assert factors[5] == pytest.approx(1.0)
    assert run_factors(progress["marks"][:-1]) == {}  # unfinished: no factors


def test_factors_need_enough_runs_take_the_median_and_are_clamped():
    speeding = fold(lambda s: 2.0 if s <= 10 else 1.0, 100)["marks"]
    steady = fold(lambda s: 1.0, 100)["marks"]
    slowing = fold(lambda s: 1.0 if s <= 10 else 5.0, 100)["marks"]
    assert pace_factors([speeding] * (PACE_MIN_RUNS - 1)) == {}
    assert pace_factors([speeding, speeding, steady])[1] == pytest.approx(0.5, abs=0.02)
    assert pace_factors([slowing] * PACE_MIN_RUNS)[1] == FACTOR_MAX
    assert pace_factors([None, "junk", [[1, 2]], steady, steady, steady])[1] == pytest.approx(1.0)
    assert factor_at({1: 0.5, 9: 0.9}, 0.05) == 0.5 and factor_at({1: 0.5, 9: 0.9}, 1.0) == 0.9
    assert factor_at({1: 0.5}, 0.45) == 1.0 and factor_at(None, 0.5) == 1.0


def test_the_eta_of_a_running_run_is_scaled_by_the_factor_of_its_tenth():
    progress = fold(lambda s: 2.0, 11)  # 2 s per step so far, at step 11 of 100
    summary = {"train": {"step": 11, "steps_total": 100}, "progress": progress}
    kwargs = {"summary": summary, "config": {"eval_every": 0}, "defaults": {"steps": 100}, "now": 20.0}
    assert run_progress(**kwargs).eta_finish_seconds == 89 * 2.0
    assert run_progress(**kwargs, pace={1: 0.5}).eta_finish_seconds == 89 * 1.0


def finished(user, name: str, marks: list, *, kind: str) -> Run:
    run = submit(user, origin="dashboard", name=name)
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.SUCCEEDED, kind=kind, finished_at=timezone.now(), summary={"progress": {"marks": marks}}
    )
    return run


@pytest.mark.django_db
def test_a_running_run_takes_the_pace_of_the_latest_finished_runs_of_its_kind(user, handoffs):
    speeding = fold(lambda s: 2.0 if s <= 10 else 1.0, 100)["marks"]
    running = submit(user, origin="dashboard", name="running")
    now = timezone.now()
    progress = fold(lambda s: 2.0, 11, t0=now.timestamp() - 20.0)
    Run.objects.filter(pk=running.pk).update(
        status=RunStatus.RUNNING, summary={"train": {"step": 11, "steps_total": 100}, "progress": progress}
    )
    run = Run.objects.get(pk=running.pk)
    assert progress_of(run, now=now).eta_finish_seconds == pytest.approx(178, abs=0.2)  # no history yet

    for i in range(PACE_MIN_RUNS):
        finished(user, f"other-{i}", speeding, kind="eval")  # another kind: not this run's history
    assert pace_of(kind=run.kind, now=now) == {}
    for i in range(PACE_MIN_RUNS):
        finished(user, f"same-{i}", speeding, kind=run.kind)
    assert pace_of(kind=run.kind, now=now)[1] == pytest.approx(0.5, abs=0.02)
    assert progress_of(run, now=now).eta_finish_seconds == pytest.approx(89, abs=2)
    paces: dict = {}
    assert progress_of(run, now=now, paces=paces).eta_finish_seconds == pytest.approx(89, abs=2)
    assert set(paces) == {run.kind}  # read once for every run of that kind


@pytest.mark.django_db
def test_a_listing_reads_the_pace_of_a_kind_once(user, handoffs, monkeypatch):
    from runs import selectors
    from runs.scheduling import finishes

    calls = []
    monkeypatch.setattr(finishes, "pace_of", lambda **kw: calls.append(kw["kind"]) or {})
    runs = [submit(user, origin="dashboard", name=f"running-{i}") for i in range(3)]
    progress = fold(lambda s: 1.0, 5, t0=timezone.now().timestamp() - 4.0)
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(
        status=RunStatus.RUNNING, summary={"train": {"step": 5, "steps_total": 50}, "progress": progress}
    )
    listed = selectors.runs_json(list(Run.objects.filter(pk__in=[r.pk for r in runs])))
    assert all(r["eta_finish_seconds"] is not None for r in listed)
    assert calls.count(runs[0].kind) <= 2  # one for the run JSONs, one for the queue's held-run finishes
