"""REST API: the shape of the slots, dry-run, concurrency settings and resources endpoints' answers, who may
change the settings, and a run's resource demand at submit. Authentication and the runs endpoints are in
test_api_runs.py."""

from __future__ import annotations

import pytest

from tests.api.clients import client_for

pytestmark = pytest.mark.django_db


def test_slots_and_dry_run(user, handoffs):
    client = client_for(user)
    snap = client.get("/api/slots/").json()
    assert set(snap) == {"policy", "borrowable", "classes", "total"}
    assert set(snap["classes"]) == {"interactive", "app", "schedule", "system"}
    assert set(snap["classes"]["app"]) == {"running", "waiting", "limit", "priority", "gpu_limit", "gpus"}
    assert snap["total"] == {"running": 0, "max_total": 4}
    dry = client.post("/api/slots/dry-run/", {"origin": "schedule"}, format="json").json()
    assert dry == {
        "origin": "schedule",
        "run_class": "schedule",
        "granted": True,
        "pending_reason": None,
        "pending_detail": None,
        "would_preempt": [],
    }
    bad = client.post("/api/slots/dry-run/", {"origin": "cron"}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "origin"


def test_settings_are_staff_only(user, staff):
    assert client_for(user).get("/api/settings/concurrency/").status_code == 403
    assert client_for(user).patch("/api/settings/concurrency/", {"max_total": 9}, format="json").status_code == 403
    admin = client_for(staff)
    assert admin.get("/api/settings/concurrency/").json()["max_total"] == 4
    patched = admin.patch(
        "/api/settings/concurrency/", {"max_total": 8, "classes": {"system": {"limit": 2}}}, format="json"
    ).json()
    off = {"fair_share": False, "max_running_per_user": None, "aging_per_hour": 0, "aging_cap": 0}
    off |= {"max_wait_seconds": None, "preemptible": False, "preempts": False}
    off |= {"team_quotas": {}, "team_borrowing_limit": None}
    assert patched == {
        "max_total": 8,
        "interactive_reserve": 2,
        "classes": {
            "interactive": {"limit": 8, "priority": 40, "gpu_limit": None, **off},
            "app": {"limit": 6, "priority": 30, "gpu_limit": None, **off},
            "schedule": {"limit": 6, "priority": 20, "gpu_limit": None, **off},
            "system": {"limit": 2, "priority": 10, "gpu_limit": None, **off},
        },
        "max_queued_per_user": 20,
        "max_running_per_user": 8,
        "default_time_limit_seconds": 86400,
        "max_time_limit_seconds": 604800,
        "fair_share_half_life_seconds": 3600,
        "user_weights": {},
        "preempt_grace_seconds": 120,
        "max_preemptions_per_run_per_day": 3,
    }
    fair = {"fair_share": True, "max_running_per_user": 2, "aging_per_hour": 5, "aging_cap": 20}
    body = {"fair_share_half_life_seconds": 60, "user_weights": {str(user.pk): 3}, "classes": {"app": fair}}
    assert client_for(user).patch("/api/settings/concurrency/", body, format="json").status_code == 403
    patched = admin.patch("/api/settings/concurrency/", body, format="json").json()
    assert patched["classes"]["app"] == {"limit": 6, "priority": 30, "gpu_limit": None, **off, **fair}
    assert patched["fair_share_half_life_seconds"] == 60 and patched["user_weights"] == {str(user.pk): 3}
    put = admin.put("/api/settings/concurrency/", {"max_total": 2}, format="json").json()
    assert put["classes"]["system"]["limit"] == 1 and put["interactive_reserve"] == 1


def test_preemption_settings_round_trip(staff):
    admin = client_for(staff)
    body = {
        "preempt_grace_seconds": 30,
        "max_preemptions_per_run_per_day": 1,
        "classes": {"interactive": {"preempts": True}, "schedule": {"preemptible": True}},
    }
    patched = admin.patch("/api/settings/concurrency/", body, format="json").json()
    assert (patched["preempt_grace_seconds"], patched["max_preemptions_per_run_per_day"]) == (30, 1)
    assert patched["classes"]["interactive"]["preempts"] and patched["classes"]["schedule"]["preemptible"]
    assert not patched["classes"]["schedule"]["preempts"] and not patched["classes"]["app"]["preemptible"]
    off = {"preempt_grace_seconds": None, "classes": {"schedule": {"preemptible": None}}}
    patched = admin.patch("/api/settings/concurrency/", off, format="json").json()
    assert patched["preempt_grace_seconds"] == 120 and not patched["classes"]["schedule"]["preemptible"]


@pytest.mark.parametrize(
    "body,field",
    [
        ({"preempt_grace_seconds": 0}, "preempt_grace_seconds"),
        ({"preempt_grace_seconds": "30"}, "preempt_grace_seconds"),
        ({"max_preemptions_per_run_per_day": 1001}, "max_preemptions_per_run_per_day"),
        ({"classes": {"schedule": {"preemptible": "true"}}}, "classes.schedule.preemptible"),
        ({"classes": {"interactive": {"preempts": 1}}}, "classes.interactive.preempts"),
    ],
)
def test_bad_preemption_settings_are_400_naming_the_field(staff, body, field):
    answer = client_for(staff).patch("/api/settings/concurrency/", body, format="json")
    assert answer.status_code == 400 and answer.json()["field"] == field


@pytest.mark.parametrize(
    "body,field",
    [
        ({"max_total": 0}, "max_total"),
        ({"max_total": True}, "max_total"),
        ({"interactive_reserve": 4}, "interactive_reserve"),
        ({"classes": {"gpu": {}}}, "classes.gpu"),
        ({"classes": {"app": {"priority": 500}}}, "classes.app.priority"),
        ([1], "body"),
        ({"fair_share_half_life_seconds": 0}, "fair_share_half_life_seconds"),
        ({"user_weights": {"<script>": 2}}, "user_weights"),
        ({"classes": {"app": {"fair_share": 1}}}, "classes.app.fair_share"),
        ({"classes": {"app": {"max_running_per_user": 0}}}, "classes.app.max_running_per_user"),
        ({"classes": {"system": {"aging_cap": 1000}}}, "classes.system.aging_cap"),
        ({"classes": {"system": {"max_wait_seconds": "1h"}}}, "classes.system.max_wait_seconds"),
    ],
)
def test_settings_validation_names_field(staff, body, field):
    answer = client_for(staff).patch("/api/settings/concurrency/", body, format="json")
    assert answer.status_code == 400 and answer.json()["field"] == field and field in answer.json()["detail"]


def test_resources_endpoint_shows_the_demand_before_submitting(user):
    client = client_for(user)
    body = client.post("/api/runs/resources/", {"kind": "rl_train", "config": {}}, format="json")
    assert body.status_code == 200, body.content
    demand = body.json()
    assert demand["strategy"] == "PACK" and demand["fits"] is True and demand["problem"] is None
    assert demand["bundles"][0]["role"] == "driver" and demand["total"]["CPU"] == 2.0
    bad = client.post("/api/runs/resources/", {"config": {"num_engines": "many"}}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "config.num_engines"
    assert client_for().post("/api/runs/resources/", {"config": {}}, format="json").status_code in (401, 403)


def test_submit_refuses_a_run_that_can_never_fit(user, handoffs):
    from django.utils import timezone

    from runs.models import ClusterNode

    ClusterNode.objects.all().delete()
    ClusterNode.objects.create(node_id="small", total={"CPU": 0.5, "GPU": 0, "memory": 1 << 34}, seen_at=timezone.now())
    client = client_for(user)
    fits = client.post("/api/runs/resources/", {"config": {}}, format="json").json()
    assert fits["fits"] is False and fits["problem"].startswith("needs 2 CPU in total; the cluster has 0.5 CPU")
    refused = client.post("/api/runs/", {"name": "big", "kind": "rl_train", "config": {}}, format="json")
    assert refused.status_code == 400 and refused.json()["field"] == "config"
    assert (
        "can never start: it needs 2 CPU in total; the cluster has 0.5 CPU (largest node 0.5)"
        in refused.json()["detail"]
    )


def test_run_json_carries_resources_and_the_resource_reason(user, handoffs):
    from runs.models import ClusterNode

    ClusterNode.objects.all().delete()  # capacity not known yet: accepted, waits
    created = client_for(user).post("/api/runs/", {"name": "r", "kind": "rl_train", "config": {}}, format="json")
    assert created.status_code == 201, created.content
    run = created.json()
    assert run["status"] == "queued" and run["resources"]["total"]["CPU"] == 2.0
    assert run["pending_reason"] == "insufficient_resources"
    assert run["pending_detail"]["message"] == "cluster capacity not known yet"


def test_dry_run_with_a_config(user, handoffs):
    client = client_for(user)
    dry = client.post("/api/slots/dry-run/", {"origin": "api", "config": {}}, format="json").json()
    assert dry["granted"] is True
    bad = client.post("/api/slots/dry-run/", {"origin": "api", "config": {"lr": "x"}}, format="json")
    assert bad.status_code == 400 and bad.json()["field"].startswith("config")


def test_gpu_limit_setting(staff):
    admin = client_for(staff)
    patched = admin.patch("/api/settings/concurrency/", {"classes": {"app": {"gpu_limit": 2}}}, format="json")
    assert patched.status_code == 200 and patched.json()["classes"]["app"]["gpu_limit"] == 2
    bad = admin.patch("/api/settings/concurrency/", {"classes": {"app": {"gpu_limit": -1}}}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "classes.app.gpu_limit"
    cleared = admin.patch("/api/settings/concurrency/", {"classes": {"app": {"gpu_limit": None}}}, format="json")
    assert cleared.json()["classes"]["app"]["gpu_limit"] is None
