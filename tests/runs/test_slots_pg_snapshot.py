"""The PostgreSQL fast path of release + grant (runs/slots/pg.py) against the ORM loader and the services'
rules: same snapshot (with and without resources), settings changes seen by the next grant, transitions and
events, and a grant statement that is all or none. The grant lock and concurrency are in test_slots_pg_lock.py."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.utils import timezone

from runs.core.lifecycle import run_finish
from runs.errors import InvalidTransition
from runs.models import ClusterNode, ConcurrencySettings, Run, RunEvent, RunStatus, Slot, SlotState
from runs.outbox.models import Effect
from runs.scheduling.concurrency import settings_update
from runs.slots import pg, store
from runs.slots.grant import Decision
from tests.runs.pg_fixtures import _needs_postgresql, _starting_args, submit  # noqa: F401 - an autouse fixture
from tests.runs.test_admission_db import nodes
from tests.runs.test_admission_db import submit as res_submit

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("total,limits", [(3, {}), (5, {"app": {"limit": 1}}), (6, {"interactive": {"limit": 2}})])
def test_sql_snapshot_equals_orm_snapshot(user, total, limits):
    settings_update(changes={"max_total": total, "classes": limits}, partial=False, by=None)
    for i, origin in enumerate(["api", "dashboard", "schedule", "system", "api", "dashboard", "system"] * 2):
        submit(user, origin=origin, name=f"r{i}")
    held = list(Slot.objects.filter(state=SlotState.HELD).values_list("run_id", flat=True))
    with transaction.atomic():
        store.slots_lock()
        policy = store.policy_load(fresh=True)
        orm = store.snapshot_load(policy)
        sql = pg.snapshot_fetch()
        assert sql.policy == policy and sql.held == orm.held and sql.waiting == orm.waiting
        # Excluding a held run gives the snapshot as it is after releasing it.
        after = pg.snapshot_fetch(exclude_run=held[0])
        Slot.objects.filter(run_id=held[0]).delete()
        assert after.held == store.snapshot_load(policy).held
        assert after.waiting == store.snapshot_load(policy).waiting
        transaction.set_rollback(True)


def test_settings_written_elsewhere_apply_to_next_grant(user):
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    first, second, third = submit(user, name="a"), submit(user, name="b"), submit(user, name="c")
    assert [r.status for r in (first, second, third)] == [RunStatus.STARTING, RunStatus.QUEUED, RunStatus.QUEUED]
    # Another process changes the row directly: no cache here is told, the row version must be noticed.
    row = ConcurrencySettings.objects.get()
    row.raw = {**row.raw, "max_total": 3}
    row.save()
    run_finish(run=first, status=RunStatus.SUCCEEDED)
    assert set(Run.objects.filter(pk__in=[second.pk, third.pk]).values_list("status", flat=True)) == {
        RunStatus.STARTING
    }


def test_finish_records_event_and_keeps_transition_rules(user):
    run = submit(user)
    queued = submit(user, name="q")
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    finished = run_finish(run=run, status=RunStatus.FAILED, error="boom")
    assert isinstance(finished, Run) and finished.status == RunStatus.FAILED and finished.error == "boom"
    assert finished.finished_at is not None and finished.config == {"steps": 1}
    last = RunEvent.objects.filter(run=run).order_by("-seq").first()
    assert (last.seq, last.type, last.data) == (
        finished.last_seq,
        "status",
        {"status": "failed", "previous": "starting", "error": "boom"},
    )
    queued.refresh_from_db()
    assert queued.status == RunStatus.STARTING  # granted by the release
    assert run_finish(run=run, status=RunStatus.SUCCEEDED).status == RunStatus.FAILED  # no-op
    waiting = submit(user, name="w")
    assert waiting.status == RunStatus.QUEUED
    with pytest.raises(InvalidTransition):
        run_finish(run=waiting, status=RunStatus.SUCCEEDED)  # queued runs cannot succeed
    assert Slot.objects.filter(run=waiting, state=SlotState.WAITING).exists()


def test_sql_snapshot_equals_orm_snapshot_with_resources(user, handoffs):
    nodes(a=(4, 2), b=(4, 2))
    ClusterNode.objects.create(node_id="dead", alive=False, total={"CPU": 99}, seen_at=timezone.now())
    settings_update(changes={"max_total": 10}, partial=True, by=None)
    for i in range(14):
        res_submit(
            user, name=f"r{i}", origin=["api", "system", "dashboard"][i % 3], cpus=1, gpus=i % 2, bundles=1 + i % 3
        )
    Slot.objects.filter(state=SlotState.HELD).update(time_limit_seconds=None)  # a held run without a limit
    with transaction.atomic():
        store.slots_lock()
        orm = store.snapshot_load(store.policy_load(fresh=True))
        sql = pg.snapshot_fetch()
        assert sql == orm and sql.capacity.keys() == {"a", "b"} and sql.running and sql.waiting
        held = sql.running[0].run_id
        after = pg.snapshot_fetch(exclude_run=held)
        Slot.objects.filter(run_id=held).delete()
        assert after == store.snapshot_load(store.policy_load(fresh=True))
        transaction.set_rollback(True)


def test_a_refused_grant_writes_nothing(user, handoffs):
    """The grant statement is all or none: one chosen run that may no longer move leaves the others waiting, and
    neither run's launch is stored."""
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    submit(user, name="f")
    a, b = submit(user, name="a"), submit(user, name="b")
    Run.objects.filter(pk=b.pk).update(status=RunStatus.CANCELLED)
    args = _starting_args()
    with pytest.raises(InvalidTransition):
        pg.grants_apply(
            decisions=[Decision(a.pk, "api", args["now"]), Decision(b.pk, "api", args["now"])],
            now=args["now"],
            source="platform",
            status=RunStatus.STARTING,
            allowed_from=args["allowed"],
            columns=args["columns"],
            effects=args["effects"]([a.pk, b.pk], args["now"]),
        )
    assert Run.objects.get(pk=a.pk).status == RunStatus.QUEUED and Slot.objects.get(run=a).state == SlotState.WAITING
    assert not RunEvent.objects.filter(run=a, data__status="starting").exists()
    assert not Effect.objects.filter(payload__run__in=[a.pk, b.pk]).exists()
