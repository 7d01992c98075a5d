"""Run comparison and distribution heatmaps in headless Chromium against the real stack (daphne, PostgreSQL,
Redis): /compare/ draws three runs, highlights one on hover, keeps the selection in the URL and lists only the
config keys that differ; the run page draws the per-step histograms of train events, 10,000 steps in under a
second."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from runs.core.events import run_events_record
from runs.models import Run, RunStatus
from tests.browser.conftest import emitter_for, login, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>'

# How many pixels of a canvas are painted (alpha > 0).
PAINTED = """(sel) => {
  const c = document.querySelector(sel);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; }"""


def make_run(owner, name: str, config: dict, steps: int, lr_speed: float) -> Run:
    start = timezone.now() - timedelta(hours=1)
    run = Run.objects.create(
        name=name, origin="api", run_class="app", kind="rl_train", owner=owner, config=config,
        status=RunStatus.SUCCEEDED, started_at=start,
    )  # fmt: skip
    events = [
        {
            "type": "train",
            "ts": (start + timedelta(seconds=s * (1 + lr_speed))).timestamp(),
            "data": {"step": s, "reward_mean": min(1.0, lr_speed * s / 10), "loss": 1 / (s + lr_speed), "kl": 0.01},
        }
        for s in range(1, steps + 1)
    ]
    run_events_record(run=run, source="attempt-1", events=events)
    return run


def test_compare_draws_three_runs_and_diffs_only_differing_keys(server, users, context) -> None:
    alice, boss = users["alice"], users["boss"]
    base = {"steps": 20, "task": "digits", "model": {"d_model": 64, "n_layer": 2}}
    one = make_run(alice, "baseline", {**base, "lr": 0.001}, steps=20, lr_speed=1.0)
    two = make_run(alice, HOSTILE, {**base, "lr": 0.003}, steps=15, lr_speed=2.0)
    three = make_run(alice, "deeper", {**base, "lr": 0.001, "model": {"d_model": 64, "n_layer": 4}}, 12, 0.5)
    hidden = make_run(boss, "boss-private-run", {**base, "lr": 9.9, "secret": "x"}, steps=3, lr_speed=1.0)
    ids = [one.pk, two.pk, three.pk]

    page = context.new_page()
    login(page, server, "alice")
    page.goto(f"{server.url}/compare/?runs={','.join(map(str, ids + [hidden.pk]))}")
    legend = page.locator("#compare-legend li")
    expect(legend).to_have_count(3)
    # The hostile name is text: shown literally, never run.
    expect(legend.nth(1).locator("a")).to_have_text(HOSTILE)
    assert page.evaluate("window.__pwned") is None
    # The other user's run is reported like a missing one, and nothing of it reaches the page.
    expect(page.locator("#compare-missing")).to_have_text(f"Not found: run {hidden.pk}.")
    assert "boss-private-run" not in page.content() and "9.9" not in page.content()

    # Three runs drawn, each with all its points, on a painted canvas.
    series = page.evaluate("window.__compare.series()")
    assert [s["points"] for s in series] == [20, 15, 12]
    assert page.evaluate(PAINTED, "#compare-plot canvas") > 500
    # Only the keys that differ, nested ones dotted: steps, task and model.d_model are the same everywhere.
    keys = page.locator("#compare-diff tbody tr").evaluate_all("rows => rows.map(r => r.dataset.key)")
    assert keys == ["lr", "model.n_layer"]
    expect(page.locator('#compare-diff tr[data-key="model.n_layer"] td')).to_have_text(["2", "2", "4"])
    expect(page.locator("#compare-diff thead th").nth(2)).to_have_text(f"{HOSTILE} (#{two.pk})")
    shot(page, "compare")

    # Hover highlights a run: on its legend entry, and near its line on the chart.
    legend.nth(2).hover()
    assert page.evaluate("window.__compare.focused()") == three.pk
    expect(legend.nth(2)).to_have_class(re.compile(r"\bfocused\b"))
    expect(legend.nth(0)).to_have_class(re.compile(r"\bdimmed\b"))
    page.mouse.move(0, 0)
    expect(legend.nth(2)).not_to_have_class(re.compile(r"\bfocused\b"))

    # The URL keeps the selection: metric and alignment survive a reload.
    page.get_by_label("Metric").select_option("loss")
    page.get_by_role("radio", name="wall time").check()
    expect(page).to_have_url(re.compile(r"metric=loss"))
    expect(page).to_have_url(re.compile(r"x=time"))
    page.reload()
    expect(page.get_by_label("Metric")).to_have_value("loss")
    expect(page.get_by_role("radio", name="wall time")).to_be_checked()
    state = page.evaluate("window.__compare.state")
    assert state == {"metric": "loss", "x": "time"}
    # Aligned by wall time: the slow run's last point is at 15 * 3 s.
    assert page.evaluate("Math.max(...window.__compare.plot().data[0])") == pytest.approx(45, abs=1)


def test_compare_refuses_bad_selections_naming_the_parameter(server, users, context) -> None:
    page = context.new_page()
    login(page, server, "alice")
    resp = page.goto(f"{server.url}/compare/?runs={','.join(str(i) for i in range(1, 12))}")
    assert resp is not None and resp.status == 400
    expect(page.get_by_test_id("compare-error")).to_have_text("runs: at most 10 runs can be compared, got 11")
    page.goto(f"{server.url}/compare/?runs=1,abc")
    expect(page.get_by_test_id("compare-error")).to_contain_text("runs: run ids are positive integers")


def test_run_page_heatmap_draws_the_train_histograms(server, users, context) -> None:
    run = Run.objects.create(
        name="heat", origin="api", run_class="app", kind="rl_train", owner=users["alice"], status=RunStatus.RUNNING
    )
    em = emitter_for(server, run)
    em.post(em.start() + [e for _ in range(6) for e in em.step_events()])
    page = context.new_page()
    login(page, server, "alice")
    page.goto(f"{server.url}/runs/{run.pk}/")
    for key in ("reward", "advantage", "response_length", "staleness"):
        canvas = page.locator(f'[data-heatmap="{key}"] canvas')
        expect(canvas).to_have_attribute("data-columns", "6")
        assert page.evaluate(PAINTED, f'[data-heatmap="{key}"] canvas') > 1000
    expect(page.locator('[data-axis="reward"]')).to_have_text("steps 1–6")
    # Live: one more step adds a column without a reload.
    em.post(em.step_events())
    expect(page.locator('[data-heatmap="reward"] canvas')).to_have_attribute("data-columns", "7")
    shot(page, "run-heatmap")


FEED_10K = """() => {
  const h = window.__run.heatmap;
  const edges = {reward: [...Array(11).keys()].map(i => i / 10),
                 advantage: [...Array(13).keys()].map(i => -2.6 + i * 5.2 / 12),
                 response_length: [...Array(8).keys()].map(i => i - 0.5), staleness: [-0.5, 0.5, 1.5]};
  const t0 = performance.now();
  for (let s = 1; s <= 10000; s++) {
    const histograms = {};
    for (const [key, e] of Object.entries(edges)) {
      const n = e.length - 1, counts = new Array(n).fill(0);
      for (let k = 0; k < 64; k++) counts[(k * 7 + s) % n] += 1;
      histograms[key] = {edges: e, counts};
    }
    h.add({run: 0, seq: 1e6 + s, ts: s, type: "train", data: {step: s, histograms}});
  }
  const fed = performance.now() - t0;
  const t1 = performance.now();
  h.flush();
  const draw = performance.now() - t1;
  const canvas = document.querySelector('[data-heatmap="reward"] canvas');
  return {fed, draw, steps: h.steps(), columns: canvas.dataset.columns, width: canvas.width};
}"""


def test_heatmap_draws_10000_steps_in_under_a_second(server, users, context) -> None:
    run = Run.objects.create(
        name="heat-10k", origin="api", run_class="app", kind="rl_train", owner=users["alice"], status=RunStatus.RUNNING
    )
    page = context.new_page()
    login(page, server, "alice")
    page.goto(f"{server.url}/runs/{run.pk}/")
    expect(page.locator('[data-heatmap="reward"] canvas')).to_be_visible()
    result = page.evaluate(FEED_10K)
    print("heatmap 10k steps:", json.dumps(result))
    assert result["steps"] == 10000
    assert int(result["columns"]) == result["width"] < 10000  # downsampled: one column per device pixel
    assert result["draw"] < 1000, f"drawing 10,000 steps took {result['draw']:.0f} ms"
    assert page.evaluate(PAINTED, '[data-heatmap="reward"] canvas') > 0.9 * result["width"] * 120
    expect(page.locator('[data-axis="reward"]')).to_contain_text("steps 1–10,000 ·")
