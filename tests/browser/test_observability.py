"""Progress on the board and the trace download on the run page, in headless Chromium against the real stack:
events posted through the real ingest move a running run's progress and finish ETA live; the run page's
"Download trace" button saves the run's Chrome trace JSON."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from runs.models import RunStatus
from tests.browser.conftest import emitter_for, login, svc

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CONFIG = {"steps": 4, "prompts_per_step": 8, "group_size": 4, "num_engines": 1, "num_workers": 1}


def test_board_progress_and_trace_download(server, users, context, tmp_path) -> None:
    alice = users["alice"]
    run = svc.run_submit(owner=alice, name="watched", origin="dashboard", kind="rl_train", config=CONFIG)
    run = svc.run_transition(run=run, status=RunStatus.RUNNING)
    em = emitter_for(server, run)
    em.post(em.start() + em.step_events())

    page = context.new_page()
    login(page, server, "alice")
    row = page.locator(f'#running tr[data-run="{run.pk}"]')
    expect(row.get_by_test_id("run-progress")).to_contain_text("25%")
    em.post(em.step_events())  # a second step: a step rate, so a finish ETA
    expect(row.get_by_test_id("run-progress")).to_contain_text("50%")
    expect(row.get_by_test_id("eta-finish")).to_contain_text("done in")

    page.goto(f"{server.url}/runs/{run.pk}/")
    with page.expect_download() as info:
        page.get_by_test_id("trace-download").click()
    download = info.value
    assert download.suggested_filename == f"run-{run.pk}-trace.json"
    path = tmp_path / "trace.json"
    download.save_as(path)
    trace = json.loads(path.read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"driver", "gate"} <= names
