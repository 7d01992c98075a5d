"""Team quotas against the database (SQLite and PostgreSQL, whichever DATABASE_URL names): the owners' groups in
the grant snapshot on both loaders (the ORM one, and on PostgreSQL the snapshot statement, which must agree),
real submits, releases and grant passes, the pending reason, the dry-run, the priority endpoint and the settings'
400s naming the field."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.db import connection, transaction

from runs.core.lifecycle import run_finish
from runs.errors import InvalidInput
from runs.models import Run, RunStatus
from runs.scheduling import queue
from runs.scheduling.concurrency import settings_update
from runs.slots import store
from tests.api.clients import client_for
from tests.runs.test_admission_db import nodes, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def teams(django_user_model):
    """red: in team red; blue: in blue and green (blue has the quota, green has none); loner: in no team."""
    groups = {name: Group.objects.create(name=name) for name in ("red", "blue", "green")}
    red, blue, loner = (django_user_model.objects.create_user(n) for n in ("red", "blue", "loner"))
    red.groups.add(groups["red"])
    blue.groups.add(groups["blue"], groups["green"])
    return red, blue, loner


def quotas(limit: int = 3, borrow: int | None = 0) -> None:
    app = {"limit": limit, "team_quotas": {"red": 1, "blue": 1}}
    if borrow is not None:
        app["team_borrowing_limit"] = borrow
    settings_update(changes={"max_total": 4, "interactive_reserve": 0, "classes": {"app": app}}, partial=False, by=None)


def status(run: Run) -> str:
    run.refresh_from_db()
    return run.status


def test_the_snapshot_carries_each_owners_quota_groups_on_both_loaders(teams, handoffs):
    red, blue, loner = teams
    nodes(a=(8, 0))
    quotas(limit=4)  # one slot stays free: red's second run is held back by its quota (no borrowing)
    runs = [submit(red, name="r1"), submit(red, name="r2"), submit(blue, name="b1"), submit(loner, name="n1")]
    assert [status(r) for r in runs] == [RunStatus.STARTING, RunStatus.QUEUED, RunStatus.STARTING, RunStatus.STARTING]
    with transaction.atomic():
        store.slots_lock()
        orm = store.snapshot_load(store.policy_load(fresh=True))
        # Only groups with a quota, sorted; the loner is in none (the remainder team, quota 4 - 2 = 2).
        assert orm.groups == {red.pk: ("red",), blue.pk: ("blue",)}
        assert [w.run_id for w in orm.waiting["app"]] == [runs[1].pk]
        if connection.vendor == "postgresql":
            from runs.slots import pg

            sql = pg.snapshot_fetch()
            assert (sql.groups, sql.waiting, sql.held, sql.running) == (orm.groups, orm.waiting, orm.held, orm.running)
            assert pg.snapshot_fetch(window=0).groups == orm.groups
        transaction.set_rollback(True)


def test_without_quotas_the_snapshot_reads_no_groups(teams, handoffs):
    red, _blue, _loner = teams
    nodes(a=(8, 0))
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    submit(red, name="r1"), submit(red, name="r2")
    with transaction.atomic():
        orm = store.snapshot_load(store.policy_load(fresh=True))
        assert orm.groups == {}
        if connection.vendor == "postgresql":
            from runs.slots import pg

            assert pg.snapshot_fetch().groups == {}


def test_a_team_at_its_quota_waits_with_its_reason_and_gets_the_slot_back(teams, staff, handoffs):
    red, blue, loner = teams
    nodes(a=(8, 0))
    quotas(borrow=0)
    first, second = submit(red, name="r1"), submit(red, name="r2")
    assert (status(first), status(second)) == (RunStatus.STARTING, RunStatus.QUEUED)  # a free slot stays idle
    info = queue.runs_queue_info(runs=[second])[second.pk]
    assert info.pending_reason == "team_quota_reached"
    assert info.pending_detail == {"team": "red", "quota": 1, "held": 1, "borrowing_limit": 0}
    dry = queue.slot_dry_run(origin="api", owner=red.pk)
    assert dry["granted"] is False and dry["pending_reason"] == "team_quota_reached"
    assert queue.slot_dry_run(origin="api", owner=blue.pk)["granted"] is True
    factors = client_for(red).get(f"/api/runs/{second.pk}/priority/").json()["factors"]
    assert factors["team"] == {
        "enabled": True,
        "team": "red",
        "quota": 1,
        "held": 1,
        "borrowing_limit": 0,
        "state": "quota_reached",
    }
    run_finish(run=first, status=RunStatus.SUCCEEDED)
    assert status(second) == RunStatus.STARTING


def test_borrowing_while_the_other_team_is_idle_then_it_goes_first(teams, handoffs):
    red, blue, _loner = teams
    nodes(a=(8, 0))
    quotas(limit=2, borrow=None)  # red 1 + blue 1 of 2; borrowing unbounded
    first, second, third = (submit(red, name=n) for n in ("r1", "r2", "r3"))
    assert [status(r) for r in (first, second, third)] == [RunStatus.STARTING, RunStatus.STARTING, RunStatus.QUEUED]
    late = submit(blue, name="b1")
    assert status(late) == RunStatus.QUEUED  # the class is full: the borrowed slot is not preempted
    assert queue.runs_queue_info(runs=[third])[third.pk].pending_reason == "team_quota_reached"
    assert queue.runs_queue_info(runs=[late])[late.pk].pending_reason == "class_limit_reached"
    run_finish(run=first, status=RunStatus.SUCCEEDED)
    assert (status(late), status(third)) == (RunStatus.STARTING, RunStatus.QUEUED)  # blue, under quota, first


@pytest.mark.parametrize(
    "app,message",
    [
        ({"team_quotas": {"red": 1, "nobody": 1}}, "no such group: 'nobody'"),
        ({"limit": 2, "team_quotas": {"red": 2, "blue": 1}}, "more than the class limit 2"),
        ({"team_quotas": {"red": "1"}}, "must be an integer"),
    ],
)
def test_bad_quotas_are_a_400_naming_the_field(teams, staff, app, message):
    with pytest.raises(InvalidInput) as caught:
        settings_update(changes={"classes": {"app": app}}, partial=True, by=None)
    assert caught.value.field == "classes.app.team_quotas" and message in caught.value.message
    response = client_for(staff).patch("/api/settings/concurrency/", {"classes": {"app": app}}, format="json")
    assert response.status_code == 400 and "classes.app.team_quotas" in str(response.json())


def test_the_settings_api_shows_the_quotas(teams, staff):
    quotas(borrow=1)
    app = client_for(staff).get("/api/settings/concurrency/").json()["classes"]["app"]
    assert app["team_quotas"] == {"blue": 1, "red": 1} and app["team_borrowing_limit"] == 1
    schedule = client_for(staff).get("/api/settings/concurrency/").json()["classes"]["schedule"]
    assert schedule["team_quotas"] == {} and schedule["team_borrowing_limit"] is None


def test_per_owner_loading_in_two_classes_agrees_on_both_loaders(teams, handoffs):
    """Classes ordered per owner (team quotas in app, a per-user limit in system), each with a budget left and
    several owners waiting: the PostgreSQL skip scan finds every owner of each class, as the ORM loader does."""
    red, blue, loner = teams
    nodes(a=(64, 0))
    app = {"limit": 6, "team_quotas": {"red": 1, "blue": 1}, "team_borrowing_limit": 0}
    system = {"limit": 6, "max_running_per_user": 1}
    classes = {"app": app, "system": system}
    settings_update(changes={"max_total": 20, "interactive_reserve": 0, "classes": classes}, partial=False, by=None)
    for owner in (red, blue, loner):
        for i in range(3):
            submit(owner, name=f"a{i}"), submit(owner, name=f"s{i}", origin="system")
    with transaction.atomic():
        store.slots_lock()
        orm = store.snapshot_load(store.policy_load(fresh=True))
        waiting_owners = {k: sorted({w.owner for w in q}) for k, q in orm.waiting.items()}
        # The loner's app runs all fit the remainder team's quota (6 - 2 = 4); red's and blue's wait.
        assert waiting_owners == {"app": sorted([red.pk, blue.pk]), "system": sorted([red.pk, blue.pk, loner.pk])}
        if connection.vendor == "postgresql":
            from runs.slots import pg

            sql = pg.snapshot_fetch()
            assert (sql.waiting, sql.held, sql.groups) == (orm.waiting, orm.held, orm.groups)
        transaction.set_rollback(True)
