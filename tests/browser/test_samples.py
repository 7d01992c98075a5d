"""The sample inspector in headless Chromium against daphne + PostgreSQL + Redis: samples posted through the
real ingest endpoint, filtered by the form (the filter lives in the URL), expanded by a click (turns, tokens
coloured by version, reward parts), found again by its URL after a reload; a click on the run page's reward
chart opens that step's samples; a hostile prompt is shown as text."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from runs.models import RunStatus, Sample
from tests.browser.conftest import emitter_for, login, shot, svc
from tests.sample_factory import sample_data

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TINY = {"steps": 6, "prompts_per_step": 8, "group_size": 4, "num_engines": 1, "num_workers": 1}
HOSTILE = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


def running_run(users):
    run = svc.run_submit(owner=users["alice"], name="inspect-me", origin="dashboard", kind="rl_train", config=TINY)
    return svc.run_transition(run=run, status=RunStatus.RUNNING)


def post_samples(em, steps: range) -> None:
    """Four samples per step: the last of each step is a stale, zero-reward, length-finished one."""
    events = []
    for step in steps:
        for k in range(4):
            bad = k == 3
            events.append(
                em.event(
                    "sample",
                    sample_data(
                        step=step,
                        group=step,
                        index=k,
                        reward=0.0 if bad else 0.25 * (k + 1),
                        advantage=float(k) - 1.5,
                        finish_reason="length" if bad else "stop",
                        staleness=1 if bad else 0,
                        prompt=HOSTILE if (step, k) == (2, 3) else f"^0{step}0{k}>",
                        completion="0123",
                        prompt_index=k,
                    ),
                )
            )
    em.post(events)


def test_filter_expand_and_follow_a_samples_url_after_reload(server, users, context) -> None:
    run = running_run(users)
    em = emitter_for(server, run)
    post_samples(em, range(1, 5))
    page = context.new_page()
    login(page, server, "alice")
    page.goto(f"{server.url}/runs/{run.pk}/samples/")
    expect(page.locator("tr.sample-row")).to_have_count(16)

    page.get_by_label("Reward ≤").fill("0")
    page.get_by_label("Finish reason").select_option("length")
    page.get_by_label("Staleness ≥").fill("1")
    page.get_by_role("button", name="Apply").click()
    page.wait_for_url(re.compile(r"finish_reason=length"))
    expect(page.locator("tr.sample-row")).to_have_count(4)
    assert set(page.locator("tr.sample-row").evaluate_all("rs => rs.map(r => r.dataset.step)")) == {"1", "2", "3", "4"}
    assert "reward_lte=0" in page.url and "staleness_gte=1" in page.url
    expect(page.get_by_label("Finish reason")).to_have_value("length")  # the form reflects the URL

    # The hostile prompt is text, not markup.
    expect(page.locator("td.text code", has_text="<script>")).to_have_count(1)
    assert page.evaluate("window.__xss") is None

    row = page.locator('tr.sample-row[data-step="3"]')
    sample_id = row.get_attribute("data-id")
    row.click()
    detail = page.locator(f'tr.sample-expanded .sample-detail[data-sample="{sample_id}"]')
    expect(detail).to_be_visible()
    expect(detail.locator(".turn-policy")).to_have_count(2)
    expect(detail.locator(".turn-tool")).to_have_text(re.compile("06>"))
    expect(detail.locator(".tok")).to_have_count(4)
    # Staleness 1: the first turn's tokens are one version behind the step's weights, the last turn's are not.
    expect(detail.locator(".turn-policy").first.locator(".tok.age-1")).to_have_count(2)
    expect(detail.locator(".turn-policy").last.locator(".tok.age-0")).to_have_count(2)
    expect(detail.locator(".reward-parts tr")).to_have_count(2)
    page.wait_for_url(re.compile(f"sample={sample_id}"))
    shot(page, "samples-expanded")

    page.reload()
    focus = page.locator("#sample-focus")
    expect(focus).to_be_visible()
    expect(page.locator("#focus-title")).to_have_text(f"Sample {sample_id} (step 3)")
    expect(focus.locator(".tok")).to_have_count(4)
    expect(page.locator("tr.sample-row")).to_have_count(4)  # the filter survived the reload too

    # The same prompt across steps, side by side.
    focus.get_by_test_id("across-link").click()
    expect(page.locator(".across-col")).to_have_count(4)
    assert "view=across" in page.url and "prompt_index=3" in page.url


def test_top_k_and_a_reward_chart_click_open_a_steps_samples(server, users, context) -> None:
    run = running_run(users)
    em = emitter_for(server, run)
    em.post(em.start())
    for _ in range(5):
        em.post(em.step_events())
    post_samples(em, range(1, 6))
    assert Sample.objects.filter(run=run).count() == 20
    page = context.new_page()
    login(page, server, "alice")
    page.goto(f"{server.url}/runs/{run.pk}/")
    over = page.locator('[data-chart="reward"] .u-over')
    expect(page.locator('[data-last="reward"]')).not_to_have_text("—")
    box = over.bounding_box()
    assert box is not None
    # Steps 1..5 span the x axis: step 3 is in the middle.
    over.hover(position={"x": box["width"] / 2, "y": box["height"] / 2})
    over.click(position={"x": box["width"] / 2, "y": box["height"] / 2})
    page.wait_for_url(re.compile(rf"/runs/{run.pk}/samples/\?step=3$"))
    expect(page.locator("tr.sample-row")).to_have_count(4)
    assert set(page.locator("tr.sample-row").evaluate_all("rs => rs.map(r => r.dataset.step)")) == {"3"}

    page.locator("#topk-k").fill("2")
    page.get_by_role("link", name="Top k by reward").click()
    page.wait_for_url(re.compile(r"step=3.*ordering=-reward.*limit=2"))
    expect(page.locator("tr.sample-row")).to_have_count(2)
    rewards = page.locator("tr.sample-row td:nth-child(4)").all_inner_texts()
    assert rewards == ["0.75", "0.5"]
    page.get_by_role("link", name="Bottom k by reward").click()
    page.wait_for_url(re.compile(r"ordering=reward&"))
    expect(page.locator("tr.sample-row td:nth-child(4)").first).to_have_text("0")
