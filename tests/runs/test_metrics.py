"""GET /metrics: who may read it, `promtool check metrics` on the real exposition, and series that follow the
queue and the runs (pending, grants, admission wait, per-run series) as runs are submitted, train and finish."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from runs.metrics.record import client as redis_client
from runs.models import Run, RunStatus
from runs.scheduling.concurrency import settings_update
from tests.runs.test_services import submit

pytestmark = pytest.mark.django_db

PROMTOOL = Path("/usr/bin/promtool")
TOKEN = "metrics-test-token-4c1d9e7f2a6b8053e"  # long enough: a short METRICS_TOKEN stops start-up


@pytest.fixture
def metrics_env(settings, redis_url):
    settings.REDIS_URL = redis_url
    settings.METRICS_REDIS_PREFIX = f"test-metrics-{uuid.uuid4().hex[:8]}"
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_PUBLIC = False
    yield settings.METRICS_REDIS_PREFIX
    r = redis_client()
    for key in r.scan_iter(f"{settings.METRICS_REDIS_PREFIX}:*"):
        r.delete(key)


def scrape() -> str:
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return response.content.decode()


def promtool_check(text: str) -> None:
    if not PROMTOOL.exists():
        pytest.fail(f"{PROMTOOL} is missing: install Debian's `prometheus` package (this test never skips)")
    done = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (
        f"promtool check metrics failed (rc {done.returncode}):\n{done.stdout}{done.stderr}"
    )


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(got: dict, name: str, **labels: str) -> float | None:
    return got.get((name, frozenset(labels.items())))


def pending_of(got: dict, run_class: str) -> float:
    return sum(v for (n, labels), v in got.items() if n == "rlcp_runs_pending" and ("run_class", run_class) in labels)


def post(run: Run, events: list[dict]) -> dict:
    response = APIClient().post(
        f"/api/runs/{run.pk}/ingest/", events, format="json", HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}"
    )
    assert response.status_code == 200, response.content
    return response.json()


def train(seq: int, step: int, staleness: int) -> dict:
    data = {"step": step, "steps_total": 10, "loss": 0.1, "reward_mean": 0.25 * step, "exact_match": 0.1 * step}
    data |= {"kl": 0.0, "entropy": 1.0, "staleness_max": staleness, "elapsed_s": float(step)}
    return {"seq": seq, "ts": 1_800_000_000.0 + step, "type": "train", "data": data}


def version(seq: int, v: int) -> dict:
    t = 1_800_000_000.0 + v
    stages = ("seal", "drain", "install", "reopen")
    phases = {p: {"start": t + i * 0.01, "end": t + i * 0.01 + 0.005} for i, p in enumerate(stages)}
    data = {"version": v, "published_at": t, "pause_ms": 35.0, "phases": phases}
    data |= {"drained": v - 1, "admitted_at_reopen": 3 * (v - 1)}  # v1 drained nothing, v2 waited for one
    return {"seq": seq, "ts": t, "type": "version", "data": data}


def gate(seq: int, v: int) -> dict:
    engine = {"engine": "engine-0", "state": "open", "version": v, "active": 0, "waiting": 0, "sessions": 0}
    engine |= {"steps": 10 * v, "rows_stepped": 25 * v}  # cumulative: the latest event's values are the series'
    data = {"state": "open", "version": v, "active": 0, "waiting": 0, "engines": [engine]}
    return {"seq": seq, "type": "gate", "data": data}


def test_metrics_need_a_token_or_a_staff_session(metrics_env, staff, user):
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    member = Client()
    member.force_login(user)
    assert member.get("/metrics").status_code == 401
    admin = Client()
    admin.force_login(staff)
    assert admin.get("/metrics").status_code == 200


def test_promtool_passes_and_series_follow_runs(metrics_env, user, handoffs, django_capture_on_commit_callbacks):
    settings_update(changes={"max_total": 2}, partial=True, by=None)
    empty = scrape()
    promtool_check(empty)
    before = samples(empty)
    assert value(before, "rlcp_runs_pending", run_class="interactive", reason="global_limit_reached") == 0

    with django_capture_on_commit_callbacks(execute=True):
        first, second, third = (submit(user, origin="dashboard", name=f"r{i}") for i in range(3))
    assert [r.status for r in (first, second, third)] == ["starting", "starting", "queued"]
    queued = samples(scrape())
    pending = pending_of(queued, "interactive")
    assert pending == 1
    assert value(queued, "rlcp_slot_grants_total", run_class="interactive") == 2
    assert value(queued, "rlcp_admission_wait_seconds_count", run_class="interactive") == 2
    assert value(queued, "rlcp_slots_in_use", run_class="interactive") == 2

    # The first run trains: its per-run series appear (reward, exact-match, staleness, pause, drain, gate).
    post(first, [train(1, 1, 0), version(2, 1), gate(3, 1), train(4, 2, 1), version(5, 2), gate(6, 2)])
    training = scrape()
    promtool_check(training)
    got = samples(training)
    run = str(first.pk)
    assert value(got, "rlcp_run_reward", run=run) == 0.5
    assert value(got, "rlcp_run_exact_match_ratio", run=run) == pytest.approx(0.2)
    assert value(got, "rlcp_run_staleness_steps_count", run=run) == 2
    assert value(got, "rlcp_run_staleness_steps_bucket", run=run, le="0.0") == 1
    assert value(got, "rlcp_run_publication_pause_seconds_count", run=run) == 2
    assert value(got, "rlcp_run_publication_pause_seconds_sum", run=run) == pytest.approx(0.07)
    assert value(got, "rlcp_run_drain_seconds_count", run=run) == 2
    assert value(got, "rlcp_run_publication_drained_leases_count", run=run) == 2
    assert value(got, "rlcp_run_publication_drained_leases_bucket", run=run, le="0.0") == 1  # a drain of nothing
    assert value(got, "rlcp_run_publication_drained_leases_sum", run=run) == 1
    assert value(got, "rlcp_run_publication_admitted_at_reopen_sum", run=run) == 3
    assert value(got, "rlcp_run_publication_admitted_at_reopen_bucket", run=run, le="2.0") == 1
    assert value(got, "rlcp_run_gate_state", run=run, state="open") == 1
    assert value(got, "rlcp_run_gate_state", run=run, state="poisoned") == 0
    assert value(got, "rlcp_run_engine_forward_steps_total", run=run, engine="engine-0") == 20
    assert value(got, "rlcp_run_engine_rows_stepped_total", run=run, engine="engine-0") == 50
    assert value(got, "rlcp_events_ingested_total", type="train") == 2
    assert value(got, "rlcp_event_ingest_duration_seconds_count") == 1

    # It finishes: its series go, its slot goes to the queued run (pending falls, one more grant and wait).
    with django_capture_on_commit_callbacks(execute=True):
        post(first, [{"seq": 7, "type": "status", "data": {"status": "succeeded", "version": 2}}])
    first.refresh_from_db()
    third.refresh_from_db()
    assert first.status == RunStatus.SUCCEEDED and third.status == RunStatus.STARTING
    finished = scrape()
    promtool_check(finished)
    after = samples(finished)
    assert not [k for k in after if ("run", run) in k[1]]
    pending = pending_of(after, "interactive")
    assert pending == 0
    assert value(after, "rlcp_slot_grants_total", run_class="interactive") == 3
    assert value(after, "rlcp_admission_wait_seconds_count", run_class="interactive") == 3
    # The job's report of its state is counted under its stored type; `status` is the platform's moves only.
    assert value(after, "rlcp_events_ingested_total", type="job_status") == 1
    assert value(after, "rlcp_events_ingested_total", type="status") is None


def agents(seq: int, step: int, engine: str = "engine-0") -> dict:
    data = {"step": step, "sessions": 3, "sessions_per_engine": {engine: 2, "engine-1": 1}, "waiting": 4}
    data |= {"requests": 10 * step, "tokens": 100 * step, "status": {"400": 1, "409": 0, "410": step, "503": 2}}
    data |= {"episodes": 8 * step, "tool_calls": 6 * step, "valid_tool_calls": 5 * step, "tool_errors": step}
    data |= {"reward_parts": {"answer": 0.25 * step, "valid_call": 0.5}}
    return {"seq": seq, "type": "agents", "data": data}


def test_agent_counters_of_a_running_run_are_exposed_and_go_when_it_ends(
    metrics_env, user, handoffs, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        run = submit(user, origin="dashboard", name="agent")
    hostile = 'e"\\n} 1\n# x'  # a job-chosen engine name: quoted, backslash, newline, exposition syntax
    post(run, [train(1, 1, 0), agents(2, 1), agents(3, 2, engine=hostile)])
    text = scrape()
    promtool_check(text)
    got = samples(text)
    label = str(run.pk)
    assert value(got, "rlcp_run_agent_sessions", run=label, engine=hostile) == 2  # the latest event wins
    assert value(got, "rlcp_run_agent_sessions", run=label, engine="engine-0") is None
    assert value(got, "rlcp_run_agent_sessions", run=label, engine="engine-1") == 1
    assert value(got, "rlcp_run_agent_requests_waiting", run=label) == 4
    assert value(got, "rlcp_run_agent_requests_total", run=label) == 20
    assert value(got, "rlcp_run_agent_tokens_total", run=label) == 200
    assert value(got, "rlcp_run_agent_error_responses_total", run=label, status="410") == 2
    assert value(got, "rlcp_run_agent_error_responses_total", run=label, status="503") == 2
    assert value(got, "rlcp_run_agent_error_responses_total", run=label, status="409") == 0
    assert value(got, "rlcp_run_agent_episodes_total", run=label) == 16
    assert value(got, "rlcp_run_agent_tool_calls_total", run=label) == 12
    assert value(got, "rlcp_run_agent_valid_tool_calls_total", run=label) == 10
    assert value(got, "rlcp_run_agent_tool_errors_total", run=label) == 2
    assert value(got, "rlcp_run_agent_reward_part", run=label, part="answer") == 0.5
    assert value(got, "rlcp_events_ingested_total", type="agents") == 2

    post(run, [{"seq": 4, "type": "status", "data": {"status": "succeeded", "version": 2}}])
    assert not [k for k in samples(scrape()) if ("run", label) in k[1]]


def test_tick_duration_and_task_failures_are_counted(metrics_env, handoffs):
    from celery import shared_task

    from runs import tasks

    @shared_task(name="tests.metrics.boom")
    def boom() -> None:
        raise RuntimeError("boom")

    tasks.tick.apply()
    tasks.tick.apply()
    assert boom.apply().failed()
    got = samples(scrape())
    assert value(got, "rlcp_tick_duration_seconds_count") == 2
    assert value(got, "rlcp_celery_task_failures_total", task="tests.metrics.boom") == 1
