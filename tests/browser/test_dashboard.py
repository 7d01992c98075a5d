"""The dashboard as a person uses it, in headless Chromium against a real daphne + PostgreSQL + Redis: submit a
run from the form, watch it on the queue board and on its own page move without a reload, cancel it; staff
tune the reserve; non-staff cannot. Runs progress through the real services and the real ingest endpoint."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from runs.models import Run, RunEvent, RunStatus
from tests.browser.conftest import emitter_for, login, shot, svc

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TINY = {"steps": 3, "prompts_per_step": 8, "group_size": 4, "num_engines": 1, "num_workers": 1}


def mark_page(page: Page) -> None:
    """A marker that survives only as long as the document: proves later checks happened without a reload."""
    page.evaluate("window.__noReload = true")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__noReload === true"), "the page reloaded"


def test_submit_from_form_then_board_updates_live(server, users, context) -> None:
    page = context.new_page()
    login(page, server, "alice")
    page.get_by_role("link", name="New run").first.click()
    expect(page.get_by_role("heading", name="New training run")).to_be_visible()
    # The run's demand, computed by the server from the form's values, before submitting; it follows the form.
    expect(page.get_by_test_id("resources-total")).to_contain_text("2 CPU")
    page.get_by_label("Num engines", exact=True).fill("4")
    expect(page.get_by_test_id("resources-total")).to_contain_text("2.8 CPU")
    page.get_by_label("Num engines", exact=True).fill("2")
    shot(page, "submit-form")

    # Inline validation from the API: an out-of-range value is named beside its field.
    page.get_by_label("Run name").fill("browser-digits")
    page.get_by_label("Steps", exact=True).fill("-1")
    page.get_by_role("button", name="Submit run").click()
    steps_error = page.locator('[data-field="steps"] .error')
    expect(steps_error).to_be_visible()
    expect(steps_error).to_contain_text(">=")
    expect(page.get_by_label("Steps", exact=True)).to_have_attribute("aria-invalid", "true")
    shot(page, "submit-form-error")

    page.get_by_label("Steps", exact=True).fill(str(TINY["steps"]))
    page.get_by_label("Prompts per step").fill(str(TINY["prompts_per_step"]))
    page.get_by_role("button", name="Submit run").click()
    page.wait_for_url(re.compile(r"/\?submitted=\d+$"))
    run = Run.objects.get(name="browser-digits")
    assert run.origin == "dashboard" and run.run_class == "interactive" and run.config["steps"] == 3

    row = page.locator(f'#running tr[data-run="{run.pk}"]')
    expect(row).to_be_visible()
    expect(row.get_by_test_id("status")).to_have_text("starting")
    mark_page(page)

    # The job comes up (as the launcher would record it) and reports: the row follows without a reload.
    svc.run_transition(run=run, status=RunStatus.RUNNING)
    expect(row.get_by_test_id("status")).to_have_text("running")
    em = emitter_for(server, run)
    em.post(em.start() + em.step_events() + em.step_events())
    expect(row.get_by_test_id("version")).to_have_text("v2")
    expect(row.locator(".progress .lbl")).to_contain_text("16 / 64 groups")
    expect(page.get_by_test_id("running-interactive")).to_have_text("1")
    expect(page.get_by_test_id("cluster")).to_have_attribute("data-nodes", "1")  # the cluster_capacity node
    assert_not_reloaded(page)
    shot(page, "board")


def test_queued_run_shows_position_reason_and_eta(server, users, context) -> None:
    boss = users["boss"]
    svc.settings_update(changes={"max_total": 2, "interactive_reserve": 1}, partial=True, by=boss)
    first = svc.run_submit(owner=boss, name="app-a", origin="api", kind="rl_train", config=TINY)
    waiting = svc.run_submit(owner=boss, name="app-b", origin="api", kind="rl_train", config=TINY)
    assert waiting.status == RunStatus.QUEUED
    page = context.new_page()
    login(page, server, "boss")
    row = page.locator(f'#waiting tr[data-run="{waiting.pk}"]')
    expect(row.get_by_test_id("position")).to_have_text("1")
    expect(row.get_by_test_id("reason")).to_have_text("Its class is at its concurrency limit")
    expect(page.get_by_test_id("reserve")).to_have_text("1")
    expect(page.get_by_test_id("borrowable")).to_have_text("1")
    mark_page(page)
    # The running one finishes: the waiting one is granted and moves to the running table live.
    svc.run_finish(run=first, status=RunStatus.SUCCEEDED)
    expect(page.locator(f'#running tr[data-run="{waiting.pk}"]')).to_be_visible()
    expect(row).to_have_count(0)
    assert_not_reloaded(page)


def test_waiting_line_moves_live_by_queue_changes(server, users, context) -> None:
    """`slots` messages carry queue moves, not the queue: alice's row moves up when staff's run ahead of hers
    (which she cannot see) leaves the line, and her new run joins behind it, all without a reload."""
    alice, boss = users["alice"], users["boss"]
    svc.settings_update(changes={"max_total": 2, "interactive_reserve": 1}, partial=True, by=boss)
    svc.run_submit(owner=boss, name="app-a", origin="api", kind="rl_train", config=TINY)  # holds the app slot
    theirs = svc.run_submit(owner=boss, name="app-b", origin="api", kind="rl_train", config=TINY)
    mine = svc.run_submit(owner=alice, name="app-c", origin="api", kind="rl_train", config=TINY)
    page = context.new_page()
    login(page, server, "alice")
    row = page.locator(f'#waiting tr[data-run="{mine.pk}"]')
    expect(row.get_by_test_id("position")).to_have_text("2")
    expect(page.locator(f'#waiting tr[data-run="{theirs.pk}"]')).to_have_count(0)  # not alice's business
    mark_page(page)
    svc.run_cancel(run=theirs, by=boss)
    expect(row.get_by_test_id("position")).to_have_text("1")
    expect(row.get_by_test_id("reason")).to_have_text("Its class is at its concurrency limit")
    later = svc.run_submit(owner=alice, name="app-d", origin="api", kind="rl_train", config=TINY)
    expect(page.locator(f'#waiting tr[data-run="{later.pk}"]').get_by_test_id("position")).to_have_text("2")
    expect(row.get_by_test_id("position")).to_have_text("1")
    assert_not_reloaded(page)


def test_run_page_follows_versions_sampler_and_gate_and_catches_up(server, users, context) -> None:
    alice = users["alice"]
    run = svc.run_submit(owner=alice, name="live-run", origin="dashboard", kind="rl_train", config=TINY)
    run = svc.run_transition(run=run, status=RunStatus.RUNNING)
    em = emitter_for(server, run)
    em.post(em.start() + em.step_events())

    page = context.new_page()
    login(page, server, "alice")
    page.goto(f"{server.url}/runs/{run.pk}/")
    expect(page.get_by_test_id("run-status")).to_have_text("running")
    expect(page.get_by_test_id("version")).to_have_text("v1")
    expect(page.get_by_test_id("sampler")).to_have_text("8 / 64")
    gate_lane = page.get_by_test_id("gate-lane")
    first_segments = int(gate_lane.get_attribute("data-segments") or 0)
    mark_page(page)

    for _ in range(3):
        em.post(em.step_events())
    expect(page.get_by_test_id("version")).to_have_text("v4")
    expect(page.get_by_test_id("sampler")).to_have_text("32 / 64")
    # Each publication adds sealed -> draining -> installing -> open to the gate timeline.
    expect(gate_lane).to_have_attribute("data-segments", str(first_segments + 12))
    expect(page.get_by_test_id("version-lane")).to_have_attribute("data-segments", "5")  # v0..v4

    # Drop the socket, miss events, reconnect: exactly the missed ones arrive (no gap, no duplicate).
    page.evaluate("window.__run.socket.close()")
    expect(page.locator("#conn-state")).to_have_attribute("data-state", "closed")
    em.post(em.step_events() + em.step_events())
    page.evaluate("window.__run.socket.reopen()")
    run.refresh_from_db()
    expect(page.get_by_test_id("last-seq")).to_have_text(str(run.last_seq))
    expect(page.get_by_test_id("version")).to_have_text("v6")
    expect(page.locator("#log-count")).to_have_text(f"{run.last_seq} of {run.last_seq} events")
    seqs = [int(s) for s in page.locator("#log-body tr td:first-child").all_inner_texts()]
    assert seqs == list(range(run.last_seq, 0, -1)), "event log has a gap or a duplicate"

    # Filtering the log by type.
    page.get_by_label("Show gate events").uncheck()
    expect(page.locator('#log-body tr[data-type="gate"]')).to_have_count(0)
    page.get_by_label("Filter events by text").fill("checkpoint")
    expect(page.locator('#log-body tr[data-type="checkpoint"]')).to_have_count(1)
    page.get_by_label("Filter events by text").fill("")
    page.get_by_label("Show gate events").check()
    assert_not_reloaded(page)
    shot(page, "run")


def test_cancel_from_run_page(server, users, context) -> None:
    alice = users["alice"]
    run = svc.run_submit(owner=alice, name="to-cancel", origin="dashboard", kind="rl_train", config=TINY)
    run = svc.run_transition(run=run, status=RunStatus.RUNNING)
    page = context.new_page()
    login(page, server, "alice")
    page.goto(f"{server.url}/runs/{run.pk}/")
    expect(page.get_by_role("button", name=re.compile("Resume from checkpoint"))).to_be_hidden()
    expect(page.get_by_role("button", name="Start over from step 0")).to_be_hidden()
    # The job reports its checkpoint of step 5 (live: the page learns the step from the stream).
    em = emitter_for(server, run)
    saved = {"step": 5, "version": 5, "path": f"/ckpt/{run.pk}/step-000005", "reason": "periodic", "state": "saved"}
    em.post([em.event("checkpoint", saved)])
    expect(page.locator('#log-body tr[data-type="checkpoint"]')).to_have_count(1)
    page.get_by_role("button", name="Cancel run").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Keep it").click()  # the confirmation really guards the action
    assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING
    page.get_by_role("button", name="Cancel run").click()
    dialog.get_by_role("button", name="Cancel run").click()
    # The run stops (stopping), its job is asked to end, and with no Ray job behind it the platform
    # finalizes it at once: the page follows both changes without a reload.
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    statuses = list(
        RunEvent.objects.filter(run=run, type="status").order_by("seq").values_list("data__status", flat=True)
    )
    assert statuses[-2:] == ["stopping", "cancelled"], statuses
    expect(page.locator("#log-body")).to_contain_text('"status":"stopping"')
    expect(page.get_by_role("button", name="Resume from checkpoint step 5")).to_be_visible()
    expect(page.get_by_role("button", name="Start over from step 0")).to_be_visible()
    shot(page, "run-cancelled")

    # Resume puts it back in line from its checkpoint (a free slot: granted at once, then waiting for its launch).
    page.get_by_role("button", name="Resume from checkpoint step 5").click()
    expect(dialog).to_contain_text("continues from its checkpoint at step 5")
    dialog.get_by_role("button", name="Resume run").click()
    expect(page.get_by_test_id("run-status")).to_have_text(re.compile("queued|starting"))
    expect(page.get_by_role("button", name="Cancel run")).to_be_visible()
    expect(page.get_by_role("button", name="Start over from step 0")).to_be_hidden()
    resumed = Run.objects.get(pk=run.pk)
    assert (resumed.attempt, resumed.resume_requested) == (1, True)


def test_a_run_without_a_checkpoint_offers_only_start_over(server, users, context) -> None:
    run = svc.run_submit(owner=users["alice"], name="no-ckpt", origin="dashboard", kind="rl_train", config=TINY)
    svc.run_finish(run=run, status=RunStatus.FAILED, error="lost before its first checkpoint")
    page = context.new_page()
    login(page, server, "alice")
    page.goto(f"{server.url}/runs/{run.pk}/")
    expect(page.get_by_role("button", name="Start over from step 0")).to_be_visible()
    expect(page.get_by_role("button", name=re.compile("Resume from checkpoint"))).to_be_hidden()
    page.get_by_role("button", name="Start over from step 0").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("it has no checkpoint")
    dialog.get_by_role("button", name="Keep it").click()  # the confirmation guards it
    assert Run.objects.get(pk=run.pk).status == RunStatus.FAILED
    page.get_by_role("button", name="Start over from step 0").click()
    dialog.get_by_role("button", name="Start over").click()
    expect(page.get_by_test_id("run-status")).to_have_text(re.compile("queued|starting"))
    assert Run.objects.get(pk=run.pk).resume_requested is False


def test_staff_reserve_validation_and_board_limits(server, users, context) -> None:
    board = context.new_page()
    login(board, server, "boss")
    expect(board.get_by_test_id("total-running")).to_contain_text("/ 4")
    mark_page(board)

    page = context.new_page()
    page.goto(f"{server.url}/settings/")
    page.get_by_label("Total slots").fill("6")
    page.get_by_label("Interactive reserve").fill("6")
    expect(page.get_by_test_id("preview-reserve")).to_have_text("5")  # live preview clamps to total - 1
    page.get_by_role("button", name=re.compile("save", re.I)).click()
    reserve_error = page.locator('.field.invalid:has(input[name="interactive_reserve"]) .error')
    expect(reserve_error).to_contain_text("must be below max_total (6)")
    expect(page.get_by_role("alert").first).to_be_visible()
    shot(page, "settings-error")

    page.get_by_label("Total slots").fill("6")
    page.get_by_label("Interactive reserve").fill("2")
    page.get_by_label("app GPU limit").fill("2")
    expect(page.get_by_test_id("preview-borrowable")).to_have_text("4")
    page.get_by_role("button", name=re.compile("save", re.I)).click()
    expect(page.get_by_test_id("effective-reserve")).to_have_text("2")
    shot(page, "settings")

    # The open board follows without a reload.
    expect(board.get_by_test_id("total-running")).to_contain_text("/ 6")
    expect(board.get_by_test_id("reserve")).to_have_text("2")
    expect(board.get_by_test_id("borrowable")).to_have_text("4")
    expect(board.locator(".cap-bar .cap-cell")).to_have_count(6)
    expect(board.locator(".cap-bar .cap-cell.reserve")).to_have_count(2)
    expect(board.get_by_test_id("gpus-app")).to_have_text("0 GPU of 2 (GPU limit)")
    assert_not_reloaded(board)


def test_non_staff_cannot_reach_settings(server, users, context) -> None:
    page = context.new_page()
    page.goto(f"{server.url}/login/")
    shot(page, "login")
    login(page, server, "alice")
    expect(page.get_by_role("navigation", name="Main").get_by_role("link", name="Settings")).to_have_count(0)
    resp = page.goto(f"{server.url}/settings/")
    assert resp is not None
    assert resp.status == 403 or "/login/" in page.url, f"non-staff got {resp.status} at {page.url}"
    assert page.get_by_label(re.compile("reserve", re.I)).count() == 0
    shot(page, "settings-forbidden")


def test_a_fresh_install_never_shows_a_time_limit_as_an_estimate(server, users, context) -> None:
    """No run has finished yet: the run holding the only slot has no finish estimate, and the one waiting behind
    it is "unknown", not its time limit ("~23h 59m" before); once the held run trains, the waiting run's ETA
    is the held run's own finish estimate, not longer."""
    alice, boss = users["alice"], users["boss"]
    svc.settings_update(changes={"max_total": 1, "interactive_reserve": 0}, partial=True, by=boss)
    held = svc.run_submit(owner=alice, name="held", origin="dashboard", kind="rl_train", config=TINY)
    waiting = svc.run_submit(owner=alice, name="waiting", origin="dashboard", kind="rl_train", config=TINY)
    assert (held.status, waiting.status) == (RunStatus.STARTING, RunStatus.QUEUED)
    assert held.time_limit_seconds and held.time_limit_seconds >= 3600  # the bound that must not show
    page = context.new_page()
    login(page, server, "alice")
    row = page.locator(f'#waiting tr[data-run="{waiting.pk}"]')
    expect(row.get_by_test_id("eta")).to_have_text("unknown")
    expect(row.get_by_test_id("reason")).to_contain_text("limit")

    svc.run_transition(run=held, status=RunStatus.RUNNING)
    em = emitter_for(server, held)
    em.post(em.start() + em.step_events() + em.step_events())  # two train steps: a step rate
    own = Run.objects.get(pk=held.pk)
    page.reload()
    held_eta = page.locator(f'#running tr[data-run="{held.pk}"]').get_by_test_id("eta-finish")
    expect(held_eta).to_contain_text("done in")
    waits, finishes = row.get_by_test_id("eta").inner_text(), held_eta.inner_text().removeprefix("done in ")
    assert _shown_seconds(waits) <= _shown_seconds(finishes) + 2, (waits, finishes, own.summary.get("progress"))


def _shown_seconds(text: str) -> float:
    """Seconds of an ETA as the board shows it: "any moment", "~42s", "~3m 05s" (hours are refused)."""
    if text == "any moment":
        return 0.0
    match = re.fullmatch(r"~(?:(\d+)m )?(\d+)s", text)
    assert match, f"not an estimate of minutes: {text!r}"
    return 60 * int(match.group(1) or 0) + int(match.group(2))
