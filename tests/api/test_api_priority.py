"""GET /api/runs/<id>/priority/: the factors of a queued run, visible like the run (owner or staff, else 404),
and positions that follow fair share (the queue's grant order) once it is on."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import Run
from runs.scheduling.concurrency import settings_update
from runs.slots.usage import usage_forget
from tests.api.clients import client_for
from tests.runs.test_admission_db import nodes, submit

pytestmark = pytest.mark.django_db


def priority(user, run):
    return client_for(user).get(f"/api/runs/{run.pk}/priority/")


def test_priority_is_visible_like_the_run(user, staff, django_user_model, handoffs):
    nodes(a=(8, 0))
    settings_update(changes={"max_total": 1, "interactive_reserve": 0}, partial=True, by=None)
    running, queued = submit(user, name="a"), submit(user, name="b")
    other = django_user_model.objects.create_user("mallory")
    assert priority(other, queued).status_code == 404
    assert client_for().get(f"/api/runs/{queued.pk}/priority/").status_code in (401, 403)
    assert client_for(user).get("/api/runs/999999/priority/").status_code == 404
    mine = priority(user, queued).json()
    assert priority(staff, queued).json()["position"] == mine["position"] == {"in_class": 1, "overall": 1}
    factors = mine["factors"]
    assert (
        factors["class_priority"] == 30 and factors["aging"]["bonus"] == 0 and factors["max_wait"]["overdue"] is False
    )
    assert factors["fair_share"]["enabled"] is False and factors["user_limit"]["reached"] is False
    assert "FIFO" in factors["order"] and factors["key"][-1] == queued.pk
    assert priority(user, running).json() == {
        "run_id": running.pk,
        "status": "starting",
        "position": None,
        "factors": None,
    }


def test_positions_follow_fair_share_and_user_limits(user, django_user_model, handoffs):
    nodes(a=(8, 0))
    light = django_user_model.objects.create_user("light")
    app = {"fair_share": True, "max_running_per_user": 2, "aging_per_hour": 10, "aging_cap": 5}
    settings_update(changes={"max_total": 1, "interactive_reserve": 0, "classes": {"app": app}}, partial=True, by=None)
    first = submit(user, name="first")
    Run.objects.filter(pk=first.pk).update(granted_at=timezone.now() - timedelta(hours=1))
    usage_forget()
    heavy_run, light_run = submit(user, name="heavy"), submit(light, name="light")
    usage_forget()
    body = client_for(light).get(f"/api/runs/{light_run.pk}/").json()
    assert body["position"] == {"in_class": 1, "overall": 1}  # ahead of the earlier run of a heavy owner
    factors = priority(user, heavy_run).json()["factors"]
    assert priority(user, heavy_run).json()["position"]["overall"] == 2
    assert factors["fair_share"] | {"usage": 0} == {"enabled": True, "usage": 0, "weight": 1, "rank": 2, "owners": 2}
    assert factors["fair_share"]["usage"] > 0 and factors["user_limit"] == {
        "max_running_per_user": 2,
        "held": 1,
        "reached": False,
    }
    dry = client_for(light).post("/api/slots/dry-run/", {"origin": "api"}, format="json").json()
    assert dry["granted"] is False and dry["pending_reason"] == "class_limit_reached"
