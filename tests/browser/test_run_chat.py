"""The run page's Chat panel in headless Chromium against the real stack: the owner's message goes through the
platform's proxy (browser session + CSRF) to a real HTTP stand-in for the run's session server
(tests/api/session_double.py), and the answer is drawn with each token's weight version, as text only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from runs.models import RunStatus
from tests.api.session_double import SessionServerDouble
from tests.browser.conftest import emitter_for, login, shot, svc

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TINY = {"steps": 3, "prompts_per_step": 8, "group_size": 4, "num_engines": 1, "num_workers": 1}


@pytest.fixture(scope="module")
def upstream() -> Iterator[SessionServerDouble]:
    server = SessionServerDouble().start()
    yield server
    server.close()


def test_owner_chats_with_the_policy_and_sees_each_tokens_version(server, users, context, upstream) -> None:
    run = svc.run_submit(owner=users["alice"], name="chat", origin="dashboard", kind="rl_train", config=TINY)
    run = svc.run_transition(run=run, status=RunStatus.RUNNING)
    upstream.keys.add(run.serving_keys()[0])
    em = emitter_for(server, run)
    em.post([em.event("serving", {"url": upstream.url, "model": "chat@v3"})])

    page = context.new_page()
    login(page, server, "alice")
    page.goto(f"{server.url}/runs/{run.pk}/")
    hostile = '<img src=x onerror="window.__pwned=1">'
    page.get_by_label("Message").fill(hostile)
    page.get_by_role("button", name="Send").click()
    log = page.get_by_test_id("chat-log")
    expect(log.locator(".chat-assistant .chat-text")).to_have_text(f"echo: {hostile}")
    tokens = log.locator(".chat-token")
    answer = f"echo: {hostile}"
    expect(tokens).to_have_count(len(answer))
    expect(tokens.first).to_have_attribute("data-version", "3")
    expect(tokens.last).to_have_attribute("data-version", "4")
    expect(tokens.last.locator(".chat-token-v")).to_have_text("v4")
    assert page.evaluate("window.__pwned === undefined")  # drawn as text, never parsed as HTML
    seen = upstream.seen[-1]["body"]
    assert seen["session_id"].startswith(f"ext-{users['alice'].pk}-chat-") and seen["logprobs"] is True

    # The next turn sends the conversation so far in the same session.
    page.get_by_label("Message").fill("again")
    page.get_by_role("button", name="Send").click()
    expect(log.locator(".chat-assistant")).to_have_count(2)
    second = upstream.seen[-1]["body"]
    assert second["session_id"] == seen["session_id"]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    shot(page, "run-chat")
