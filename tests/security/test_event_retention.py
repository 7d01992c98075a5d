"""Per-run retention of stored events through the real ingest endpoint (issue 9, point 2): a run cannot grow
its event table without bound, high-rate types are thinned first, the platform's status events are always
stored, the stored stream stays gapless (seq 1..last_seq), and dropped events still update the summary."""

from __future__ import annotations

import pytest

from runs.core.lifecycle import run_status_change
from runs.models import Run, RunEvent, RunStatus
from tests.realtime.conftest import gate, run_make, train, user_make
from tests.realtime.test_ingest import post

pytestmark = pytest.mark.django_db


def stored(run: Run) -> list[tuple[int, str, int | None]]:
    return list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type", "source_seq"))


def test_events_past_the_budget_are_thinned_then_refused_and_the_stream_stays_gapless(settings) -> None:
    settings.EVENTS_MAX_PER_RUN = 20
    settings.EVENTS_DOWNSAMPLE_EVERY = 5
    run = run_make(user_make("alice"))

    # Below half the budget: everything is stored.
    assert post(run, [train(i, i) for i in range(1, 11)]).json()["stored"] == 10
    # From half of it on: 1 in 5 high-rate events (by the emitter's seq), every other type.
    body = post(run, [train(i, i) for i in range(11, 31)] + [gate(31)]).json()
    assert (body["stored"], body["dropped"]) == (5, 16)  # train 15, 20, 25, 30 and the gate
    assert [s for _, t, s in stored(run) if t == "train"][10:] == [15, 20, 25, 30]
    # A re-post of a dropped event is dropped again, not stored late.
    assert post(run, [train(11, 11)]).json()["stored"] == 0
    # Up to the budget, then nothing more from the job, of any type.
    assert post(run, [gate(i) for i in range(32, 36)]).json()["stored"] == 4
    body = post(run, [gate(i) for i in range(40, 50)] + [train(50, 50)]).json()
    assert Run.objects.get(pk=run.pk).last_seq == 20 and body["stored"] == 1 and body["dropped"] == 10
    assert post(run, [train(51, 51)]).json() == {
        "stored": 0,
        "duplicates": 0,
        "last_seq": 20,
        "status": "running",
        "dropped": 1,
        "commands": [],
    }

    # The platform's own status events are never dropped, whatever the budget.
    run_status_change(run=Run.objects.get(pk=run.pk), status=RunStatus.STOPPING)
    rows = stored(run)
    assert rows[-1][:2] == (21, "status")
    assert [seq for seq, _, _ in rows] == list(range(1, 22))  # gapless: replay by seq keeps its contract

    # A dropped event still updates what the board and the run header show.
    assert Run.objects.get(pk=run.pk).summary["train"]["step"] == 51


def test_default_budget_is_finite() -> None:
    from django.conf import settings

    assert 0 < settings.EVENTS_MAX_PER_RUN <= 1_000_000
    assert settings.EVENTS_PAGE_MAX <= 10_000
