"""A run's stored `status` events are the platform's moves, each once: a path of runs.core.lifecycle.TRANSITIONS. The
job reports its own state with `status` events too (trainer/events.py); ingest stores those as `job_status`, so
the run's event log (what the run page lists) never shows a move twice (issue 25, point 2). Migration 0013
renames the job's reports stored before it, and its reverse renames them back."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from rest_framework.test import APIClient

from runs.core.lifecycle import TRANSITIONS
from runs.execution.outcome import eval_summary_record
from runs.execution.submit import run_submit
from runs.messages import StatusMoveData
from runs.models import Run, RunEvent, RunStatus
from tests.runs.helpers import TEST_JOB_KIND

pytestmark = pytest.mark.django_db(transaction=True)  # ingest finishes a run after its commit

BEFORE = ("runs", "0012_run_serving_url")  # the last migration before 0013_job_status_events


def submit(user) -> Run:
    return run_submit(owner=user, name="r", origin="api", kind=TEST_JOB_KIND, config={})


def report(seq: int, **data) -> dict:
    """A job's report of its state, as the trainer posts it (type `status`)."""
    return {"seq": seq, "ts": time.time(), "type": "status", "data": data}


def ingest(run: Run, events: list[dict]) -> dict:
    response = APIClient().post(
        f"/api/runs/{run.pk}/ingest/", events, format="json", HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}"
    )
    assert response.status_code == 200, response.content
    return response.json()


def test_the_run_log_holds_each_move_once_and_the_jobs_reports_apart(user, handoffs):
    run = submit(user)
    assert run.status == RunStatus.STARTING  # granted at once
    # The job's first post starts the run (its kind has no placement group); it says `running` itself too, and
    # a `previous` it sends is not declared by its schema: dropped, so its report cannot pass for a move.
    assert ingest(run, [report(1, status="running", version=0, previous="starting")])["status"] == "running"
    done = ingest(run, [report(2, status="succeeded", version=3, metrics={"reward": 0.5})])
    assert done["status"] == "succeeded"

    owner = APIClient()
    owner.force_authenticate(user)
    log = owner.get(f"/api/runs/{run.pk}/events/").json()  # what the run page's event log lists
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    moves = [(e["data"]["previous"], e["data"]["status"]) for e in log if e["type"] == "status"]
    assert all(e["data"].keys() == StatusMoveData.__annotations__.keys() for e in log if e["type"] == "status")
    assert moves == [(None, "queued"), ("queued", "starting"), ("starting", "running"), ("running", "succeeded")]
    assert all(after in TRANSITIONS[before] for before, after in moves[1:])
    assert [e["data"] for e in log if e["type"] == "job_status"] == [
        {"status": "running", "version": 0},
        {"status": "succeeded", "version": 3, "metrics": {"reward": 0.5}},
    ]
    assert {e["type"] for e in log} == {"status", "job_status"}
    assert set(RunEvent.objects.filter(run=run, type="status").values_list("source", flat=True)) == {"platform"}


def test_the_eval_summary_reads_the_jobs_final_report(user, handoffs):
    run = submit(user)
    ingest(run, [report(1, status="running"), report(2, status="succeeded", metrics={"held_out_exact_match": 0.25})])
    eval_summary_record(run=Run.objects.get(pk=run.pk))
    assert Run.objects.get(pk=run.pk).summary["eval"] == {"held_out_exact_match": 0.25}


def test_the_migration_renames_the_jobs_reports_stored_before_it(user):
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE])
    old = executor.loader.project_state([BEFORE]).apps
    OldRun, OldEvent = old.get_model("runs", "Run"), old.get_model("runs", "RunEvent")
    run = OldRun.objects.create(name="old", origin="api", run_class="app", kind=TEST_JOB_KIND, owner_id=user.pk)
    stored = [  # an old run's log: each move of the platform and each report of its job under `status`
        ("platform", None, "status", {"status": "queued", "previous": None, "error": ""}),
        ("platform", None, "status", {"status": "starting", "previous": "queued", "error": ""}),
        ("platform", None, "status", {"status": "running", "previous": "starting", "error": ""}),
        ("attempt-0", 1, "status", {"status": "running", "version": 0}),
        ("attempt-0", 2, "train", {"step": 1}),
        ("attempt-0", 3, "status", {"status": "succeeded", "version": 1}),
        ("platform", None, "status", {"status": "succeeded", "previous": "running", "error": ""}),
        ("platform", None, "log", {"message": "gate reset requested"}),
    ]
    for seq, (source, source_seq, etype, data) in enumerate(stored, start=1):
        OldEvent.objects.create(
            run_id=run.pk, seq=seq, source=source, source_seq=source_seq, ts=timezone.now(), type=etype, data=data
        )

    def types() -> list[str]:
        return list(RunEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("type", flat=True))

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert types() == ["status", "status", "status", "job_status", "train", "job_status", "status", "log"]
    MigrationExecutor(connection).migrate([BEFORE])  # back to the old code's reading
    assert types() == [etype for _, _, etype, _ in stored]
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())  # and forward again: the latest schema for what follows
    assert types().count("job_status") == 2
