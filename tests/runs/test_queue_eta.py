"""A queued run's ETA comes from the held runs' predicted finishes (runs/scheduling/queue.py,
runs/scheduling/finishes.py), read from the database as the run JSON and the board read it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import selectors
from runs.models import Run, RunStatus
from runs.scheduling import queue
from runs.scheduling.concurrency import settings_update
from tests.runs.test_services import submit

pytestmark = pytest.mark.django_db


def training(run: Run, *, step: int, total: int, seconds_per_step: float) -> None:
    """The summary the ingest folds from train events: steps 1..step, the latest one now."""
    now = timezone.now().timestamp()
    points = [[now - (step - s) * seconds_per_step, float(s), 0.0] for s in range(1, step + 1)]
    train = {"step": step, "steps_total": total}
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING, summary={"train": train, "progress": {"points": points, "eval_s": None}}
    )


def test_queued_eta_is_the_held_runs_finish(user, handoffs):
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    held = submit(user, origin="dashboard", name="held")
    waiting = submit(user, origin="dashboard", name="waiting")
    assert waiting.status == RunStatus.QUEUED
    training(held, step=10, total=40, seconds_per_step=3.0)  # 30 steps left: about 90 s

    body = selectors.runs_json([Run.objects.get(pk=held.pk), waiting])
    running, queued = body
    assert running["progress"] == 0.25 and running["eta_finish_seconds"] == pytest.approx(90, abs=2)
    assert queued["eta_seconds"] == pytest.approx(90, abs=2)
    assert queued["progress"] is None and queued["eta_finish_seconds"] is None

    # A second waiting run starts after the first one has run a typical run's length; none finished yet, so
    # nothing tells that length, and one grant tells no grant rate: unknown.
    later = submit(user, origin="dashboard", name="later")
    info = queue.runs_queue_info(runs=[waiting, later])
    assert info[waiting.pk].eta_seconds == pytest.approx(90, abs=2)
    assert info[later.pk].eta_seconds is None


def test_insufficient_resources_eta_uses_the_predicted_finish(user, handoffs):
    from tests.runs.test_admission_db import nodes
    from tests.runs.test_admission_db import submit as submit_demand

    nodes(a=(2, 0))
    held = submit_demand(user, name="held", cpus=2, time_limit_seconds=3600)
    waiting = submit_demand(user, name="waiting", cpus=2, time_limit_seconds=3600)
    assert held.status == RunStatus.STARTING and waiting.status == RunStatus.QUEUED
    info = queue.runs_queue_info(runs=[waiting])[waiting.pk]
    assert info.pending_reason == "insufficient_resources"
    assert info.eta_seconds is None  # no finish predicted yet: unknown (its time limit is no estimate)
    training(held, step=10, total=20, seconds_per_step=6.0)  # 10 steps left: about 60 s
    info = queue.runs_queue_info(runs=[waiting])[waiting.pk]
    assert info.eta_seconds == pytest.approx(60, abs=2)


def finished(user, *, kind: str, seconds: list[float]) -> None:
    """Runs of `kind` that succeeded lately, each `seconds[i]` from grant to finish."""
    now = timezone.now()
    for i, s in enumerate(seconds):
        end = now - timedelta(minutes=i + 1)
        Run.objects.create(
            name=f"done-{i}",
            origin="api",
            run_class="app",
            kind=kind,
            owner=user,
            status=RunStatus.SUCCEEDED,
            granted_at=end - timedelta(seconds=s),
            finished_at=end,
        )


def test_a_held_run_without_a_step_rate_is_predicted_to_take_a_typical_run_of_its_kind(user, handoffs):
    """A starting run (or one before its second train step) has no finish ETA: the queue behind it used to
    wait for its time limit (a day away by default, on a fresh install's board as "~23h 59m"); now it is
    unknown until runs of its kind that finished lately tell a typical duration, counted from its grant.
    Another kind's history does not tell the held run's length; it only gives the recent grant rate."""
    from runs.scheduling.queue import grant_rate_per_second

    settings_update(changes={"max_total": 1}, partial=True, by=None)
    held = submit(user, origin="dashboard", name="held", time_limit_seconds=86400)
    waiting = submit(user, origin="dashboard", name="waiting")
    assert (held.status, waiting.status) == (RunStatus.STARTING, RunStatus.QUEUED)
    eta = lambda: queue.runs_queue_info(runs=[waiting])[waiting.pk].eta_seconds  # noqa: E731
    assert eta() is None  # nothing known yet, one grant tells no rate: unknown, never the time limit

    finished(user, kind="eval", seconds=[5.0, 5.0, 5.0])  # another kind: a grant rate, no length
    rate = grant_rate_per_second(now=timezone.now())
    assert rate is not None and eta() == pytest.approx(1 / rate, rel=0.1)
    finished(user, kind=held.kind, seconds=[30.0, 40.0, 50.0])
    Run.objects.filter(pk=held.pk).update(granted_at=timezone.now() - timedelta(seconds=15))
    assert eta() == pytest.approx(40 - 15, abs=2)  # the median of its kind, from its grant
    Run.objects.filter(pk=held.pk).update(granted_at=timezone.now() - timedelta(seconds=300))
    assert eta() == pytest.approx(0, abs=1)  # past the typical length, not yet done: any moment, never negative
    # Once it trains, its own rate wins.
    training(held, step=10, total=40, seconds_per_step=3.0)
    assert eta() == pytest.approx(90, abs=2)
