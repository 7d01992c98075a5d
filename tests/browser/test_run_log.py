"""The run page's event log in headless Chromium against the real stack: each move of the platform's state machine
is one `status` row, and the job's own reports of its state (posted as `status`, stored as `job_status`) are
rows of their own type, which their chip hides, so no move reads twice (issue 25, point 2)."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from runs.models import RunStatus
from tests.browser.conftest import emitter_for, login, shot, svc

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CONFIG = {"steps": 4, "prompts_per_step": 8, "group_size": 4, "num_engines": 1, "num_workers": 1}


def test_the_log_shows_each_move_once_and_the_jobs_reports_apart(server, users, context) -> None:
    run = svc.run_submit(owner=users["alice"], name="logged", origin="dashboard", kind="rl_train", config=CONFIG)
    run = svc.run_transition(run=run, status=RunStatus.RUNNING)
    page = context.new_page()
    login(page, server, "alice")
    page.goto(f"{server.url}/runs/{run.pk}/")
    expect(page.get_by_test_id("run-status")).to_have_text("running")

    # Live, as the job posts: it says it runs, trains a step, then fails (no follow-up run: no auto-resume).
    em = emitter_for(server, run)
    em.post([em.event("status", {"status": "running", "version": 0}), *em.start(), *em.step_events()])
    em.post([em.event("status", {"status": "failed", "version": 1, "error": "ValueError: bad batch"})])
    expect(page.get_by_test_id("run-status")).to_have_text("failed")

    moves = page.locator('#log-body tr[data-type="status"] td.data')
    expect(moves).to_have_count(4)
    newest_first = [json.loads(text) for text in moves.all_inner_texts()]
    assert [(m["previous"], m["status"]) for m in reversed(newest_first)] == [
        (None, "queued"),
        ("queued", "starting"),
        ("starting", "running"),
        ("running", "failed"),
    ]
    assert newest_first[0]["error"] == "job failed: ValueError: bad batch"
    reports = page.locator('#log-body tr[data-type="job_status"] td.data')
    expect(reports).to_have_count(2)
    assert [json.loads(text)["status"] for text in reports.all_inner_texts()] == ["failed", "running"]
    shot(page, "run-log-moves")

    page.get_by_label("Show job_status events").uncheck()
    expect(reports).to_have_count(0)
    expect(moves).to_have_count(4)
