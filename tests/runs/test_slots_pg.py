"""The PostgreSQL fast path of release + grant (runs/slots/pg.py) against the ORM loader and the services'
rules: same snapshot, settings changes seen by the next grant, transitions, events, and releases committed
without the grant lock and granted after their commit."""

from __future__ import annotations

import threading

import pytest
from django.db import close_old_connections, connection, transaction
from django.utils import timezone
from psycopg.pq import TransactionStatus

from runs import lifecycle, services, stores
from runs.errors import InvalidTransition
from runs.models import ClusterNode, ConcurrencySettings, Run, RunEvent, RunStatus, Slot, SlotState
from runs.slots import pg, store
from runs.slots.grant import Decision
from runs.stores import PG_STORE
from tests.runs.helpers import TEST_KIND
from tests.runs.test_admission_db import nodes
from tests.runs.test_admission_db import submit as res_submit

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _needs_postgresql() -> None:
    # The suite runs on PostgreSQL (`make test`); on another database this path is not used, so say so loudly.
    if connection.vendor != "postgresql":
        pytest.fail(
            "tests/runs/test_slots_pg.py tests the PostgreSQL path: run it with a postgres DATABASE_URL", pytrace=False
        )


def submit(owner, origin="api", name="r"):
    return services.run_submit(owner=owner, name=name, origin=origin, kind=TEST_KIND, config={"steps": 1})


@pytest.mark.parametrize("total,limits", [(3, {}), (5, {"app": {"limit": 1}}), (6, {"interactive": {"limit": 2}})])
def test_sql_snapshot_equals_orm_snapshot(user, total, limits):
    services.settings_update(changes={"max_total": total, "classes": limits}, partial=False, by=None)
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
    services.settings_update(changes={"max_total": 1}, partial=True, by=None)
    first, second, third = submit(user, name="a"), submit(user, name="b"), submit(user, name="c")
    assert [r.status for r in (first, second, third)] == [RunStatus.STARTING, RunStatus.QUEUED, RunStatus.QUEUED]
    # Another process changes the row directly: no cache here is told, the row version must be noticed.
    row = ConcurrencySettings.objects.get()
    row.raw = {**row.raw, "max_total": 3}
    row.save()
    services.run_finish(run=first, status=RunStatus.SUCCEEDED)
    assert set(Run.objects.filter(pk__in=[second.pk, third.pk]).values_list("status", flat=True)) == {
        RunStatus.STARTING
    }


def test_finish_records_event_and_keeps_transition_rules(user):
    run = submit(user)
    queued = submit(user, name="q")
    services.settings_update(changes={"max_total": 1}, partial=True, by=None)
    finished = services.run_finish(run=run, status=RunStatus.FAILED, error="boom")
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
    assert services.run_finish(run=run, status=RunStatus.SUCCEEDED).status == RunStatus.FAILED  # no-op
    waiting = submit(user, name="w")
    assert waiting.status == RunStatus.QUEUED
    with pytest.raises(InvalidTransition):
        services.run_finish(run=waiting, status=RunStatus.SUCCEEDED)  # queued runs cannot succeed
    assert Slot.objects.filter(run=waiting, state=SlotState.WAITING).exists()


def _lock_free_elsewhere() -> bool:
    """Whether another connection could take the grant lock right now (it takes and drops it at once)."""
    import psycopg

    params = connection.get_connection_params()
    dsn = f"host={params['host']} port={params.get('port') or 5432} dbname={params['dbname']} user={params['user']}"
    with psycopg.connect(dsn, autocommit=True) as other:
        got = other.execute("SELECT pg_try_advisory_lock(%s)", [store.GRANT_LOCK_KEY]).fetchone()[0]
        if got:
            other.execute("SELECT pg_advisory_unlock(%s)", [store.GRANT_LOCK_KEY])
    return bool(got)


@pytest.mark.django_db(transaction=True)
def test_release_commits_without_the_lock_and_grants_after_its_commit(user, handoffs):
    services.settings_update(changes={"max_total": 1}, partial=True, by=None)
    first, second = submit(user, name="a"), submit(user, name="b")
    with transaction.atomic():  # a caller's transaction: the grant waits for its commit
        services.run_finish(run=first, status=RunStatus.SUCCEEDED)
        assert not store.lock_held() and _lock_free_elsewhere()
        assert Run.objects.get(pk=second.pk).status == RunStatus.QUEUED
    second.refresh_from_db()
    assert second.status == RunStatus.STARTING and handoffs.dispatched[-1] == second.pk
    # Outside any transaction: granted before run_finish returns.
    services.run_finish(run=second, status=RunStatus.FAILED)
    third = submit(user, name="c")
    services.run_finish(run=third, status=RunStatus.SUCCEEDED)
    fourth = submit(user, name="d")
    assert fourth.status == RunStatus.STARTING
    fifth = submit(user, name="e")
    services.run_finish(run=fourth, status=RunStatus.SUCCEEDED)
    assert Run.objects.get(pk=fifth.pk).status == RunStatus.STARTING


def hold_grant_lock(*, until: threading.Event) -> threading.Thread:
    """A thread that takes the grant lock in a transaction and commits once `until` is set; returned once it
    holds the lock."""
    holding = threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                store.slots_lock()
                holding.set()
                assert until.wait(15)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    assert holding.wait(15)
    return thread


@pytest.mark.django_db(transaction=True)
def test_a_release_blocked_by_the_lock_is_granted_by_its_holder(user, handoffs):
    """The lost-wakeup race, step by step: a holder has the lock when a release commits, so the releaser's
    try-lock fails and it leaves; the holder's check after its own commit grants for it."""
    services.settings_update(changes={"max_total": 1}, partial=True, by=None)
    first, second = submit(user, name="a"), submit(user, name="b")
    release_done = threading.Event()
    thread = hold_grant_lock(until=release_done)
    services.run_finish(run=first, status=RunStatus.SUCCEEDED)  # commits; its try-lock fails; returns
    assert Run.objects.get(pk=second.pk).status == RunStatus.QUEUED
    release_done.set()
    thread.join(15)
    # The holder committed and, before its thread ended, checked: the freed slot went to `second`.
    assert Run.objects.get(pk=second.pk).status == RunStatus.STARTING
    assert handoffs.dispatched[-1] == second.pk


def test_sql_snapshot_equals_orm_snapshot_with_resources(user, handoffs):
    nodes(a=(4, 2), b=(4, 2))
    ClusterNode.objects.create(node_id="dead", alive=False, total={"CPU": 99}, seen_at=timezone.now())
    services.settings_update(changes={"max_total": 10}, partial=True, by=None)
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


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_grants_cannot_both_take_the_last_cpu(user, handoffs):
    nodes(a=(1, 0))
    barrier, ids, errors = threading.Barrier(2), [], []

    def one(i: int) -> None:
        try:
            barrier.wait()
            ids.append(res_submit(user, name=f"c{i}", cpus=1).pk)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(ids) == 2
    statuses = sorted(Run.objects.filter(pk__in=ids).values_list("status", flat=True))
    assert statuses == [RunStatus.QUEUED, RunStatus.STARTING]
    assert Slot.objects.filter(state=SlotState.HELD).count() == 1


def _starting_args() -> dict:
    now = timezone.now()
    return {
        "now": now,
        "allowed": lifecycle.allowed_from(RunStatus.STARTING),
        "columns": lifecycle.stamp("starting", now),
    }


def test_a_refused_grant_writes_nothing(user, handoffs):
    """The grant statement is all or none: one chosen run that may no longer move leaves the others waiting."""
    services.settings_update(changes={"max_total": 1}, partial=True, by=None)
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
        )
    assert Run.objects.get(pk=a.pk).status == RunStatus.QUEUED and Slot.objects.get(run=a).state == SlotState.WAITING
    assert not RunEvent.objects.filter(run=a, data__status="starting").exists()


def _idle_and_lock_free() -> bool:
    return connection.connection.info.transaction_status == TransactionStatus.IDLE and _lock_free_elsewhere()


@pytest.mark.django_db(transaction=True)
def test_a_failed_catch_up_pass_leaves_the_lock_free(user, handoffs, monkeypatch):
    services.settings_update(changes={"max_total": 1}, partial=True, by=None)
    first, second = submit(user, name="a"), submit(user, name="b")
    Slot.objects.filter(run=first).delete()  # capacity freed without a grant: the pass below has work

    def broken(*args, **kwargs):
        raise RuntimeError("decision failed")

    with monkeypatch.context() as patched:
        patched.setattr(stores, "plan", broken)
        with pytest.raises(RuntimeError, match="decision failed"):
            PG_STORE.catch_up_pass(**_starting_args())
    assert _idle_and_lock_free()

    begin = pg.pass_begin

    def finished_meanwhile():  # the chosen run ends between the snapshot and the grant statement
        snapshot = begin()
        Run.objects.filter(pk=second.pk).update(status=RunStatus.CANCELLED)
        return snapshot

    with monkeypatch.context() as patched:
        patched.setattr(pg, "pass_begin", finished_meanwhile)
        with pytest.raises(InvalidTransition):
            PG_STORE.catch_up_pass(**_starting_args())
    assert _idle_and_lock_free() and Slot.objects.get(run=second).state == SlotState.WAITING
    Run.objects.filter(pk=second.pk).update(status=RunStatus.QUEUED)
    moved, pending = PG_STORE.catch_up_pass(**_starting_args())
    assert [m.run_id for m in moved] == [second.pk] and not pending and _idle_and_lock_free()


@pytest.mark.django_db(transaction=True)
def test_a_catch_up_pass_leaves_when_the_lock_is_held(user, handoffs):
    services.settings_update(changes={"max_total": 1}, partial=True, by=None)
    first, second = submit(user, name="a"), submit(user, name="b")
    Slot.objects.filter(run=first).delete()
    done = threading.Event()
    thread = hold_grant_lock(until=done)
    try:
        assert PG_STORE.catch_up_pass(**_starting_args()) is None
        assert connection.connection.info.transaction_status == TransactionStatus.IDLE
    finally:
        done.set()
        thread.join(15)
    assert Run.objects.get(pk=second.pk).status == RunStatus.STARTING  # the holder's check granted it


@pytest.mark.django_db(transaction=True)
def test_a_release_that_takes_the_lock_always_releases_it(user, handoffs, monkeypatch):
    """Outside a transaction the release's message takes the grant lock (session level) with the snapshot when it
    is free; the pass on that snapshot releases it, even when publishing the finish fails or the move was a no-op."""
    services.settings_update(changes={"max_total": 1}, partial=True, by=None)
    first, second, third = submit(user, name="a"), submit(user, name="b"), submit(user, name="c")

    def broken(*args, **kwargs):
        raise RuntimeError("publish failed")

    with monkeypatch.context() as patched:
        patched.setattr(lifecycle, "moved_publish", broken)
        with pytest.raises(RuntimeError, match="publish failed"):
            services.run_finish(run=first, status=RunStatus.SUCCEEDED)
    assert _idle_and_lock_free() and Run.objects.get(pk=second.pk).status == RunStatus.STARTING
    assert services.run_finish(run=first, status=RunStatus.FAILED).status == RunStatus.SUCCEEDED  # a no-op
    assert _idle_and_lock_free() and Run.objects.get(pk=third.pk).status == RunStatus.QUEUED
