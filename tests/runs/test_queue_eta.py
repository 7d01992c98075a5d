"""A queued run's ETA comes from the held runs' predicted finishes (runs/queue.py, runs/finishes.py), read from
the database as the run JSON and the board read it."""

from __future__ import annotations

import pytest
from django.utils import timezone

from runs import selectors, services
from runs.models import Run, RunStatus
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
    services.settings_update(changes={"max_total": 1}, partial=True, by=None)
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
    # nothing tells that length: the old estimate (position over the grant rate) is what remains.
    later = submit(user, origin="dashboard", name="later")
    info = selectors.runs_queue_info(runs=[waiting, later])
    assert info[waiting.pk].eta_seconds == pytest.approx(90, abs=2)
    assert info[later.pk].eta_seconds is not None and info[later.pk].eta_seconds != info[waiting.pk].eta_seconds


def test_insufficient_resources_eta_uses_the_predicted_finish(user, handoffs):
    from tests.runs.test_admission_db import nodes
    from tests.runs.test_admission_db import submit as submit_demand

    nodes(a=(2, 0))
    held = submit_demand(user, name="held", cpus=2, time_limit_seconds=3600)
    waiting = submit_demand(user, name="waiting", cpus=2, time_limit_seconds=3600)
    assert held.status == RunStatus.STARTING and waiting.status == RunStatus.QUEUED
    info = selectors.runs_queue_info(runs=[waiting])[waiting.pk]
    assert info.pending_reason == "insufficient_resources"
    assert info.eta_seconds == pytest.approx(3600, abs=5)  # no finish predicted yet: its time limit
    training(held, step=10, total=20, seconds_per_step=6.0)  # 10 steps left: about 60 s
    info = selectors.runs_queue_info(runs=[waiting])[waiting.pk]
    assert info.eta_seconds == pytest.approx(60, abs=2)
