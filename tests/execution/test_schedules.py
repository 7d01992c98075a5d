"""Schedules: the staff CRUD API validates cron and kind config, non-staff get 403, and the tick's
`schedules_submit_due` submits exactly one `schedule`-origin run per due schedule and moves it on."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from config.celery_app import app as celery_app
from runs.execution.schedules import schedules_submit_due
from runs.models import Run, Schedule

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def private_task_queue(monkeypatch, submission_prefix):
    """Grants enqueue launch tasks; keep them off the queue other test sessions' workers consume."""
    monkeypatch.setattr(celery_app.conf, "task_default_queue", f"{submission_prefix}-unit")


@pytest.fixture
def staff(django_user_model):
    client = APIClient()
    client.force_authenticate(django_user_model.objects.create_user(username="ops", is_staff=True))
    return client


def test_staff_crud_with_validation(staff, django_user_model):
    created = staff.post(
        "/api/schedules/", {"name": "nightly", "cron": "0 3 * * *", "config": {"steps": 10}}, format="json"
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["kind"], body["enabled"], body["owner"]) == ("rl_train", True, "ops")
    assert body["next_run_at"].endswith("03:00:00Z")

    bad_cron = staff.post("/api/schedules/", {"name": "x", "cron": "every day"}, format="json")
    assert bad_cron.status_code == 400 and bad_cron.json()["field"] == "cron"
    bad_config = staff.post(
        "/api/schedules/", {"name": "x", "cron": "* * * * *", "config": {"steps": -1}}, format="json"
    )
    assert bad_config.status_code == 400 and bad_config.json()["field"] == "config.steps"
    bad_kind = staff.post("/api/schedules/", {"name": "x", "cron": "* * * * *", "kind": "nope"}, format="json")
    assert bad_kind.status_code == 400 and bad_kind.json()["field"] == "kind"

    url = f"/api/schedules/{body['id']}/"
    patched = staff.patch(url, {"cron": "*/5 * * * *", "enabled": False}, format="json")
    assert patched.status_code == 200 and patched.json()["cron"] == "*/5 * * * *"
    assert staff.patch(url, {"owner": 3}, format="json").json()["field"] == "owner"
    assert [s["id"] for s in staff.get("/api/schedules/").json()] == [body["id"]]
    assert staff.delete(url).status_code == 204
    assert staff.get(url).status_code == 404

    plain = APIClient()
    plain.force_authenticate(django_user_model.objects.create_user(username="bob"))
    assert plain.get("/api/schedules/").status_code == 403
    assert APIClient().get("/api/schedules/").status_code in (401, 403)


def test_due_schedules_submit_one_run_each(django_user_model):
    owner = django_user_model.objects.create_user(username="cron-owner")
    now = timezone.now()
    due = Schedule.objects.create(
        name="due",
        cron="*/10 * * * *",
        kind="rl_train",
        config={"steps": 5},
        owner=owner,
        next_run_at=now - timedelta(minutes=25),
    )
    Schedule.objects.create(
        name="later", cron="0 0 1 1 *", kind="rl_train", owner=owner, next_run_at=now + timedelta(days=1)
    )
    Schedule.objects.create(
        name="off",
        cron="* * * * *",
        kind="rl_train",
        owner=owner,
        enabled=False,
        next_run_at=now - timedelta(minutes=5),
    )

    submitted = schedules_submit_due(now=now)
    assert len(submitted) == 1  # missed cron times are not replayed as a burst
    run = Run.objects.get(pk=submitted[0])
    assert (run.origin, run.run_class, run.owner, run.config) == ("schedule", "schedule", owner, {"steps": 5})
    due.refresh_from_db()
    assert due.last_run == run and now < due.next_run_at <= now + timedelta(minutes=10)
    assert schedules_submit_due(now=now) == []  # a second tick at the same time submits nothing


def test_schedule_names_leave_room_for_their_runs_names(staff, django_user_model):
    """A fired run is named '<schedule> @ YYYY-MM-DD HH:MM': a schedule name that would make it longer than
    a run name may be is refused at creation (400 naming `name`), and the longest accepted one fires."""
    from runs.execution.schedules import SCHEDULE_NAME_MAX
    from runs.execution.submit import NAME_MAX

    assert SCHEDULE_NAME_MAX == NAME_MAX - len(" @ 2026-01-01 00:00")
    for name in ("n" * (SCHEDULE_NAME_MAX + 1), "n" * NAME_MAX):
        refused = staff.post("/api/schedules/", {"name": name, "cron": "0 3 * * *"}, format="json")
        assert refused.status_code == 400 and refused.json()["field"] == "name", refused.content
    created = staff.post("/api/schedules/", {"name": "n" * SCHEDULE_NAME_MAX, "cron": "0 3 * * *"}, format="json")
    assert created.status_code == 201, created.content
    url = f"/api/schedules/{created.json()['id']}/"
    assert staff.patch(url, {"name": "n" * (SCHEDULE_NAME_MAX + 1)}, format="json").json()["field"] == "name"

    Schedule.objects.filter(pk=created.json()["id"]).update(next_run_at=timezone.now() - timedelta(minutes=1))
    (run_id,) = schedules_submit_due()
    name = Run.objects.get(pk=run_id).name
    assert len(name) == NAME_MAX and name.startswith("n" * SCHEDULE_NAME_MAX + " @ ")


def test_admin_schedule_form_checks_like_the_api(django_user_model):
    """The admin's schedule form goes through runs.execution.schedules.schedule_check, as POST /api/schedules/ does: an
    eval schedule whose owner may not see the source run is refused (before, the admin stored it), and so is a
    name with no room for the fired runs' suffix."""
    from django.test import Client

    from runs.execution.schedules import SCHEDULE_NAME_MAX

    alice = django_user_model.objects.create_user(username="alice")
    bob = django_user_model.objects.create_user(username="bob")
    root = django_user_model.objects.create_superuser(username="root", password="pw-root-long-enough")
    alices = Run.objects.create(owner=alice, name="a", origin="api", kind="rl_train", config={"steps": 1})
    browser = Client()
    browser.force_login(root)

    def add(**fields):
        form = {"name": "e", "cron": "0 3 * * *", "kind": "eval", "owner": bob.pk, "enabled": "on"} | fields
        return browser.post("/admin/runs/schedule/add/", form)

    refused = add(config=json.dumps({"source_run": alices.pk}))
    assert refused.status_code == 200 and not Schedule.objects.exists()  # the form again, with the error
    assert f"no rl_train run with id {alices.pk}" in refused.content.decode()
    too_long = add(kind="rl_train", config='{"steps": 1}', name="n" * (SCHEDULE_NAME_MAX + 1))
    assert too_long.status_code == 200 and not Schedule.objects.exists()
    assert f"at most {SCHEDULE_NAME_MAX} characters" in too_long.content.decode()

    ok = add(config=json.dumps({"source_run": alices.pk}), owner=alice.pk)  # alice may see her own run
    assert ok.status_code == 302, ok.content.decode()[:2000]
    assert Schedule.objects.get().owner == alice
