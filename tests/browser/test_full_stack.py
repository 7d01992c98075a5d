"""One real tiny run through the whole stack, watched in the browser: submitted from the form, granted,
launched by a real Celery worker as a real Ray job running the real trainer, its events ingested and
streamed to the board and the run page until it succeeds."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from playwright.sync_api import expect

from runs.models import Run
from tests.browser.conftest import login, shot

# The execution tests' real-process platform (daphne + Celery worker/beat on the test DB, the shared Ray head).
from tests.execution.conftest import TINY_TRAIN_CONFIG, platform, ray_jobs_ready, submission_prefix  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


# Long enough to be seen `running` on the board: the 6 steps of the tiny config train in about 2 s on an idle
# machine, and the row went from `starting` straight off the board between two of Playwright's polls.
CONFIG = {**TINY_TRAIN_CONFIG, "steps": 40}


def test_tiny_run_from_the_form_to_success(platform, users, context) -> None:  # noqa: F811
    platform.start_worker()
    page = context.new_page()
    login(page, SimpleNamespace(url=platform.web_url), "alice")
    page.goto(f"{platform.web_url}/runs/new/")
    page.get_by_label("Run name").fill("full-stack")
    page.locator("summary", has_text="Advanced").click()
    for name, value in CONFIG.items():
        page.locator(f"#cfg-{name}").fill(str(value))
    page.get_by_role("button", name="Submit run").click()
    page.wait_for_url(re.compile(r"/\?submitted=\d+$"))
    run = Run.objects.get(name="full-stack")
    assert {k: run.config[k] for k in CONFIG} == CONFIG

    row = page.locator(f'#running tr[data-run="{run.pk}"]')
    expect(row.get_by_test_id("status")).to_have_text("running", timeout=90_000)
    row.get_by_role("link", name="full-stack").click()
    expect(page.get_by_test_id("version")).to_have_text(re.compile(r"^v[1-9]"), timeout=120_000)
    expect(page.get_by_test_id("sampler")).to_have_text(re.compile(r"^\d+ / \d+$"))
    expect(page.get_by_test_id("gate-lane")).not_to_have_attribute("data-segments", "0")
    expect(page.get_by_test_id("run-status")).to_have_text("succeeded", timeout=180_000)
    steps = CONFIG["steps"]
    expect(page.get_by_test_id("version")).to_have_text(f"v{steps}")
    expect(page.get_by_test_id("step")).to_have_text(str(steps))
    shot(page, "run-full-stack")

    # The trace of the finished run (what the run page's button downloads): every part of the real job has its
    # track, and there is one publication span per published version.
    trace = page.request.get(f"{platform.web_url}/api/runs/{run.pk}/trace/").json()
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"driver", "learner", "gate"} <= tracks
    assert any(t.startswith("engine-") for t in tracks) and any(t.startswith("worker-") for t in tracks)
    publishes = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"].startswith("publish v")]
    assert sorted(e["args"]["version"] for e in publishes) == list(range(1, steps + 1))
