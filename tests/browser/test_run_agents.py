"""The run page's Agents panel in headless Chromium against the real stack: live sessions per engine, requests
waiting at the gate, the 400/409/410/503 answers, tool calls and errors, reward parts and a chart of the valid
tool-call rate over steps, folded live from `agents` events posted to the real ingest endpoint in the shape the
job emits (trainer/reports.py agents_data). Engine and reward-part names are the job's: shown as text, never run."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runs.models import RunStatus
from tests.browser.conftest import emitter_for, login, shot, svc
from trainer.event_schema import data_clean
from trainer.reports import agents_data

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TINY = {"steps": 3, "prompts_per_step": 8, "group_size": 4, "num_engines": 1, "num_workers": 1}
HOSTILE = '<img src=x onerror="window.__pwned=1">'


class _Group:
    def __init__(self, parts: list[dict]) -> None:
        self.meta = {"reward_parts": parts}


def step_data(step: int, calls: int, valid: int, waiting: int) -> dict:
    server = {
        "sessions": 5,
        "sessions_per_engine": {"engine-0": 3, HOSTILE: 2},
        "waiting": waiting,
        "requests": 40 * step,
        "tokens": 900 * step,
        "status": {"400": 1, "409": 0, "410": step, "503": 2 * step},
    }
    worker = {"agents": {"episodes": 32 * step, "tool_calls": calls, "valid_tool_calls": valid, "tool_errors": step}}
    parts = [{"answer": 0.25 * step, "valid_call": valid / max(calls, 1), HOSTILE: 1.0}]
    data = agents_data(step, [server], [worker], [_Group(parts)])  # type: ignore[list-item]
    assert data_clean("agents", data) == data
    return data


def test_agents_panel_shows_sessions_gate_errors_tools_and_rates_live(server, users, context) -> None:
    alice = users["alice"]
    run = svc.run_submit(owner=alice, name="agents", origin="dashboard", kind="rl_train", config=TINY)
    run = svc.run_transition(run=run, status=RunStatus.RUNNING)
    em = emitter_for(server, run)

    page = context.new_page()
    login(page, server, "alice")
    page.goto(f"{server.url}/runs/{run.pk}/")
    expect(page.locator("#agents-card")).to_be_hidden()  # no environment in the config, no agents event yet

    em.post([em.event("agents", step_data(1, calls=10, valid=1, waiting=3))])
    expect(page.locator("#agents-card")).to_be_visible()
    expect(page.get_by_test_id("agents-sessions")).to_have_text("5")
    expect(page.get_by_test_id("agents-waiting")).to_have_text("3")
    expect(page.get_by_test_id("agents-410")).to_have_text("1")
    expect(page.get_by_test_id("agents-503")).to_have_text("2")
    expect(page.get_by_test_id("agents-400")).to_have_text("1")
    expect(page.get_by_test_id("agents-409")).to_have_text("0")
    expect(page.get_by_test_id("agents-valid")).to_have_text("1 (10%)")
    engines = page.get_by_role("table", name="Sessions per engine")
    expect(engines.get_by_role("cell", name=HOSTILE, exact=True)).to_be_visible()  # the name, as text
    assert page.evaluate("window.__pwned === undefined")

    # Live, the next step: the chart's valid-rate point is that step's own calls (9 valid of 10 new ones).
    em.post([em.event("agents", step_data(2, calls=20, valid=10, waiting=0))])
    expect(page.get_by_test_id("agents-410")).to_have_text("2")
    expect(page.get_by_test_id("agents-waiting")).to_have_text("0")
    expect(page.get_by_test_id("agents-tool-errors")).to_have_text("2")
    expect(page.get_by_test_id("agents-valid")).to_have_text("10 (50%)")
    legend = page.get_by_test_id("agents-legend")
    expect(legend).to_contain_text("valid tool-call rate: 0.9")
    expect(legend).to_contain_text("reward part answer: 0.5")
    expect(legend).to_contain_text(f"reward part {HOSTILE}: 1")
    expect(page.locator("[data-testid=agents-chart] svg polyline")).to_have_count(4)  # rate + 3 parts
    expect(page.locator("[data-testid=agents-part]")).to_have_count(3)
    expect(page.locator("#agents img")).to_have_count(0)
    assert page.evaluate("window.__pwned === undefined")
    shot(page, "run-agents")
