"""An audit row exists exactly when its change committed: a refused or rolled-back mutation writes none,
concurrent mutations (threads; PostgreSQL, or SQLite with a file test database) each write exactly one, and no row
can be changed or deleted."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction
from django.test import Client
from knox.models import AuthToken

from runs.audit.models import AuditEntry, AuditImmutable
from runs.audit.record import PLATFORM_ACTOR, Actor, audit_record
from runs.core.cancel import run_cancel
from runs.core.lifecycle import run_finish
from runs.errors import InvalidInput, InvalidTransition, ServiceError
from runs.execution.followups import run_followups
from runs.execution.restart import runs_interrupted
from runs.execution.submit import run_submit
from runs.models import Run, RunStatus, Schedule
from runs.scheduling.concurrency import settings_update
from runs.scheduling.enqueue import run_resume
from tests.runs.helpers import TEST_KIND


def submit(owner, name: str = "r") -> Run:
    return run_submit(owner=owner, name=name, origin="api", kind=TEST_KIND, config={"steps": 1})


@pytest.mark.django_db
def test_refused_and_rolled_back_mutations_write_no_row(user, staff, handoffs) -> None:
    with pytest.raises(InvalidInput):
        run_submit(owner=user, name="r", origin="api", kind=TEST_KIND, config={"nope": 1})
    with pytest.raises(InvalidInput):
        settings_update(changes={"max_total": -1}, partial=True, by=staff)
    assert AuditEntry.objects.count() == 0
    run = submit(user)
    assert AuditEntry.objects.count() == 1
    # The caller's transaction rolls back after the cancel: neither the cancel nor its row survive.
    with pytest.raises(RuntimeError), transaction.atomic():
        run_cancel(run=run, by=user)
        assert AuditEntry.objects.filter(action="run.cancel").count() == 1
        raise RuntimeError("caller fails after the cancel")
    assert Run.objects.get(pk=run.pk).status != RunStatus.CANCELLED
    assert AuditEntry.objects.filter(action="run.cancel").count() == 0
    # A resume the state machine refuses writes nothing.
    with pytest.raises(InvalidTransition):
        run_resume(run=run, by=user, from_scratch=True)
    assert list(AuditEntry.objects.values_list("action", flat=True)) == ["run.submit"]


@pytest.mark.django_db
def test_a_row_cannot_be_changed_or_deleted(user) -> None:
    with transaction.atomic():
        row = audit_record(Actor(user_id=user.pk, name="alice"), "run.cancel", target_type="run", target_id=1)
    row.actor_name = "mallory"
    with pytest.raises(AuditImmutable):
        row.save()
    with pytest.raises(AuditImmutable):
        row.delete()
    with pytest.raises(AuditImmutable):
        AuditEntry.objects.filter(pk=row.pk).update(actor_name="mallory")
    with pytest.raises(AuditImmutable):
        AuditEntry.objects.all().delete()
    assert AuditEntry.objects.get(pk=row.pk).actor_name == "alice"


@pytest.mark.django_db(transaction=True)  # no test transaction around it: autocommit, as outside a writer
def test_a_row_is_written_only_inside_a_transaction() -> None:
    with pytest.raises(RuntimeError, match="inside the transaction"):
        audit_record(PLATFORM_ACTOR, "run.preempt", target_type="run", target_id=1)


@pytest.mark.django_db(transaction=True)
def test_concurrent_mutations_each_write_exactly_one_row(user, other_user, handoffs) -> None:
    if connection.vendor == "sqlite" and "memory" in str(connection.settings_dict["NAME"]):
        pytest.fail("threads on SQLite need a file test database: set SQLITE_TEST_NAME", pytrace=False)
    runs = [submit(user if i % 2 else other_user, f"r{i}") for i in range(12)]
    contested = runs[0]
    errors: list[Exception] = []

    def act(job) -> None:
        try:
            job()
        except ServiceError as exc:  # the losers of the contested cancel: the run is already cancelled
            errors.append(exc)
        finally:
            connection.close()

    jobs = [lambda r=r: run_cancel(run=r, by=r.owner) for r in runs[1:]]  # 11 different runs
    jobs += [lambda: run_cancel(run=contested, by=contested.owner) for _ in range(6)]  # 6 on the same run
    jobs += [lambda: submit(user, "late") for _ in range(5)]
    threads = [threading.Thread(target=act, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    cancels = list(AuditEntry.objects.filter(action="run.cancel").values_list("target_id", flat=True))
    assert sorted(cancels, key=int) == [str(r.pk) for r in runs]  # one row per run, the contested one once
    assert AuditEntry.objects.filter(action="run.submit").count() == 12 + 5
    # Each contested cancel that did not change the run wrote nothing: 409 (cancelled) or a stopping no-op.
    assert len(errors) <= 5 and all(isinstance(e, InvalidTransition) for e in errors)


@pytest.mark.django_db
def test_platform_actions_are_audited_as_the_platform(user, handoffs) -> None:
    """Restart recovery (runs.execution.restart), auto-resume (runs.execution.followups) and the scheduler
    act without a request: their rows name `platform`, no user id and no request id."""
    starting = submit(user, "interrupted")
    assert starting.status == RunStatus.STARTING
    assert runs_interrupted(stopping=False, observed={}) == {starting.pk: "requeued"}
    failing = run_submit(owner=user, name="f", origin="api", kind=TEST_KIND, config={"steps": 1}, auto_resume=True)
    failed = run_finish(run=failing, status=RunStatus.FAILED, error="boom")
    assert run_followups(run_id=failed.pk, finished_at=failed.finished_at) == "restarted"  # no checkpoint: step 0
    rows = list(AuditEntry.objects.filter(actor_name="platform").order_by("id"))
    assert [(r.action, r.target_id) for r in rows] == [
        ("run.requeue", str(starting.pk)),
        ("run.resume", str(failing.pk)),
    ]
    assert all(r.actor_user_id is None and r.request_id == "" and r.actor_token == "" for r in rows)
    assert rows[0].before["status"] == "starting" and rows[0].after["status"] == "queued"


@pytest.mark.django_db
def test_the_admins_schedule_writes_are_audited(django_user_model, user) -> None:
    """The Django admin writes schedules itself (runs/admin.py): add, change and delete each write one row,
    as the staff user who did it; a form the admin refuses writes none."""
    root = django_user_model.objects.create_superuser(username="root", password="pw-root-long-enough")
    browser = Client()
    browser.force_login(root)
    form = {"name": "nightly", "cron": "0 3 * * *", "kind": TEST_KIND, "config": '{"steps": 1}', "owner": user.pk}
    assert browser.post("/admin/runs/schedule/add/", form | {"cron": "never"}).status_code == 200  # refused
    assert AuditEntry.objects.count() == 0
    assert browser.post("/admin/runs/schedule/add/", form | {"enabled": "on"}).status_code == 302
    schedule = Schedule.objects.get()
    assert browser.post(f"/admin/runs/schedule/{schedule.pk}/change/", form).status_code == 302  # disabled
    assert browser.post(f"/admin/runs/schedule/{schedule.pk}/delete/", {"post": "yes"}).status_code == 302
    rows = list(AuditEntry.objects.order_by("id"))
    assert [(r.actor_name, r.action, r.target_id) for r in rows] == [
        ("root", "schedule.create", str(schedule.pk)),
        ("root", "schedule.update", str(schedule.pk)),
        ("root", "schedule.delete", str(schedule.pk)),
    ]
    assert (rows[1].before["enabled"], rows[1].after["enabled"]) == (True, False)
    assert rows[2].before["name"] == "nightly" and rows[2].after is None
    # The admin's bulk "delete selected" action: one row per schedule.
    for name in ("a", "b"):
        browser.post("/admin/runs/schedule/add/", form | {"name": name})
    ids = [str(pk) for pk in Schedule.objects.values_list("pk", flat=True)]
    bulk = {"action": "delete_selected", "_selected_action": ids, "post": "yes"}
    assert browser.post("/admin/runs/schedule/", bulk).status_code == 302 and not Schedule.objects.exists()
    assert sorted(AuditEntry.objects.filter(action="schedule.delete").values_list("target_id", flat=True)) == sorted(
        [str(schedule.pk), *ids]
    )


@pytest.mark.django_db
def test_the_admins_token_pages_are_audited(django_user_model, user) -> None:
    """knox's admin pages create and delete tokens themselves: each writes one row, naming the token's prefix
    (never the token) and whose it is."""
    root = django_user_model.objects.create_superuser(username="root", password="pw-root-long-enough")
    browser = Client()
    browser.force_login(root)
    assert browser.post("/admin/knox/authtoken/add/", {"user": user.pk}).status_code == 302
    token = AuthToken.objects.get(user=user)
    assert browser.post(f"/admin/knox/authtoken/{token.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not AuthToken.objects.filter(user=user).exists()
    rows = list(AuditEntry.objects.order_by("id"))
    prefix = token.token_key[:8]
    assert [(r.actor_name, r.action, r.target_id) for r in rows] == [
        ("root", "token.create", prefix),
        ("root", "token.revoke", prefix),
    ]
    assert rows[0].after == {"user": "alice"} and rows[1].before == {"user": "alice", "tokens": [prefix]}
