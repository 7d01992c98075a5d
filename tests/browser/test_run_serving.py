"""The run page's serving panel in headless Chromium against the real stack: in-flight requests per engine,
drain time, requests drained and admitted at reopen per publication, evictions and aborted episodes, folded live
from events posted to the real ingest endpoint in the shapes the job emits (trainer/reports.py gate_data, the
loop's version and rollout events)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runs.models import RunStatus
from tests.browser.conftest import emitter_for, login, shot, svc
from trainer.reports import gate_data

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TINY = {"steps": 3, "prompts_per_step": 8, "group_size": 4, "num_engines": 1, "num_workers": 1}


def engine(i: int, state: str, inflight: int, evictions: int, name: str | None = None) -> dict:
    """One engine's snapshot as the batching engine reports it (extra keys are dropped by gate_data)."""
    return {
        "engine": name or f"engine-{i}",
        "state": state,
        "version": 1,
        "epoch": 1,
        "active": inflight,
        "waiting": 0,
        "sessions": 5,
        "inflight": inflight,
        "max_batch": 64,
        "max_sessions": 4096,
        "evictions": evictions,
        "rejections": 1,
        "steps": 40,
        "rows_stepped": 100 if i == 0 else 900,  # 2.5 and 22.5 rows a forward step
        "drained": False,
        "recent_failures": [],
    }


def test_serving_panel_shows_inflight_drain_evictions_and_aborts_live(server, users, context) -> None:
    alice = users["alice"]
    run = svc.run_submit(owner=alice, name="serving", origin="dashboard", kind="rl_train", config=TINY)
    run = svc.run_transition(run=run, status=RunStatus.RUNNING)
    em = emitter_for(server, run)
    hostile = '<img src=x onerror="window.__pwned=1">'
    snap = {"state": "open", "version": 1, "active": 7, "waiting": 0}
    first = [engine(0, "open", 3, 0), engine(1, "open", 4, 2, hostile)]
    draining = {**snap, "state": "draining", "active": 1, "engines": [engine(0, "draining", 1, 0)]}
    aborts = {"step": 3, "groups": 8, "samples": 32, "aborted": 3, "aborted_by": {"gate_wait": 2, "quiesce": 3}}
    failed = {"step": 3, "version": 2, "reason": "periodic", "state": "failed", "error": "1 of 3 in-flight"}
    v1 = {"version": 1, "published_at": em.t, "pause_ms": 850.0, "drain_ms": 12.5}
    counts = [
        {"engine": "engine-0", "drained": 1, "admitted_at_reopen": 2},
        {"engine": hostile, "drained": 2, "admitted_at_reopen": 0},
    ]
    v2 = {"version": 2, "published_at": em.t, "pause_ms": 900.0, "drain_ms": 40.0}
    v2 |= {"drained": 3, "admitted_at_reopen": 2, "engines": counts}
    em.post(
        [
            em.event("gate", gate_data({**snap, "engines": first})),
            em.event("version", {**v1, "drained": 0, "admitted_at_reopen": 0}),  # a drain of nothing
            em.event("rollout", {"step": 2, "groups": 8, "samples": 32, "aborted": 2, "aborted_by": {"gate_wait": 2}}),
        ]
    )

    page = context.new_page()
    login(page, server, "alice")
    page.goto(f"{server.url}/runs/{run.pk}/")
    expect(page.get_by_test_id("serving-inflight")).to_have_text("7")
    expect(page.get_by_test_id("serving-evictions")).to_have_text("2")
    expect(page.get_by_test_id("serving-aborted")).to_have_text("2")
    expect(page.get_by_test_id("serving-drain")).to_have_text("12.5 ms")
    expect(page.get_by_test_id("serving-aborted-by")).to_contain_text("gate wait 2")
    expect(page.locator("#serving tr[data-engine]")).to_have_count(2)
    expect(page.get_by_test_id("engine-rows-per-step")).to_have_text(["2.5", "22.5"])
    per_engine = page.get_by_role("table", name="Requests per engine")
    expect(per_engine.get_by_role("cell", name=hostile)).to_be_visible()  # escaped: shown as text, never run
    assert page.evaluate("window.__pwned === undefined")

    # Live: a drain, a publication, more aborts (a quiesce) and a failed checkpoint arrive without a reload.
    em.post(
        [
            em.event("gate", gate_data(draining)),
            em.event("version", v2),
            em.event("rollout", aborts),
            em.event("checkpoint", failed),
        ]
    )
    expect(page.get_by_test_id("serving-drain")).to_have_text("40 ms")
    expect(page.get_by_test_id("serving-aborted")).to_have_text("5")
    expect(page.get_by_test_id("serving-inflight")).to_have_text("5")  # engine-0 now 1, the other still 4
    expect(page.get_by_test_id("publication-drain")).to_have_text(["40 ms", "12.5 ms"])
    expect(page.get_by_test_id("publication-drained")).to_have_text(["3", "0"])  # requests each drain waited for
    expect(page.get_by_test_id("publication-admitted")).to_have_text(["2", "0"])
    expect(page.get_by_test_id("publication-engines")).to_have_text(
        f"v2 per engine (drained / admitted at reopen): engine-0 1 / 2 · {hostile} 2 / 0"  # escaped: text
    )
    assert page.evaluate("window.__pwned === undefined")
    expect(page.get_by_test_id("serving-quiesce")).to_contain_text("1 checkpoint(s) failed")
    shot(page, "run-serving")


def test_staff_reset_a_poisoned_gate_from_the_run_page_and_the_owner_cannot(server, users, context) -> None:
    from runs.models import RunControl

    run = svc.run_submit(owner=users["alice"], name="poisoned", origin="dashboard", kind="rl_train", config=TINY)
    run = svc.run_transition(run=run, status=RunStatus.RUNNING)
    em = emitter_for(server, run)
    snap = {"state": "poisoned", "version": 2, "active": 0, "waiting": 3}
    em.post([em.event("gate", gate_data({**snap, "engines": [engine(0, "poisoned", 0, 0)]}))])

    owner = context.new_page()
    login(owner, server, "alice")
    owner.goto(f"{server.url}/runs/{run.pk}/")
    expect(owner.get_by_test_id("gate")).to_have_text("poisoned")
    expect(owner.get_by_role("button", name="Reset gate")).to_have_count(0)  # not rendered for non-staff

    staff_context = context.browser.new_context(viewport={"width": 1360, "height": 900})
    boss = staff_context.new_page()
    login(boss, server, "boss")
    boss.goto(f"{server.url}/runs/{run.pk}/")
    boss.get_by_role("button", name="Reset gate").click()
    boss.get_by_label("Reason").fill("engine-0 was restarted by <ops>")
    boss.locator("#gate-reset-ok").click()
    expect(boss.locator("#action-message")).to_contain_text("Gate reset #")
    control = RunControl.objects.get(run_id=run.pk)
    assert (control.reason, control.requested_by.username) == ("engine-0 was restarted by <ops>", "boss")
    # The job hears of it in its next ingest reply; its answer reopens the gate and hides the button.
    assert em.post([])["commands"][0]["id"] == control.pk
    done = {"id": control.pk, "kind": "gate_reset", "outcome": "applied", "detail": "every engine held v2"}
    em.post([em.event("control", done), em.event("gate", gate_data({**snap, "state": "open", "engines": []}))])
    expect(boss.get_by_test_id("gate")).to_have_text("open")
    expect(boss.get_by_role("button", name="Reset gate")).to_be_hidden()
    expect(boss.locator('#log-body tr[data-type="log"]')).to_contain_text("requested by boss")
    staff_context.close()
