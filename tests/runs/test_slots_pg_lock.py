"""The PostgreSQL fast path of release + grant (runs/slots/pg.py) and the grant lock: releases committed
without the lock and granted after their commit, the lost-wakeup race step by step, two concurrent grants for
the last CPU, and catch-up passes and releases that always leave the lock free. Snapshots, settings and
transitions are in test_slots_pg_snapshot.py."""

from __future__ import annotations

import threading

import pytest
from django.db import close_old_connections, connection, transaction
from psycopg.pq import TransactionStatus

from runs.core import lifecycle, stores
from runs.core.lifecycle import run_finish
from runs.core.stores import PG_STORE
from runs.errors import InvalidTransition
from runs.models import Run, RunStatus, Slot, SlotState
from runs.scheduling.concurrency import settings_update
from runs.slots import pg, store
from tests.runs.pg_fixtures import _needs_postgresql, _starting_args, submit  # noqa: F401 - an autouse fixture
from tests.runs.test_admission_db import nodes
from tests.runs.test_admission_db import submit as res_submit

pytestmark = pytest.mark.django_db


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
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    first, second = submit(user, name="a"), submit(user, name="b")
    with transaction.atomic():  # a caller's transaction: the grant waits for its commit
        run_finish(run=first, status=RunStatus.SUCCEEDED)
        assert not store.lock_held() and _lock_free_elsewhere()
        assert Run.objects.get(pk=second.pk).status == RunStatus.QUEUED
    second.refresh_from_db()
    assert second.status == RunStatus.STARTING and handoffs.dispatched[-1] == second.pk
    # Outside any transaction: granted before run_finish returns.
    run_finish(run=second, status=RunStatus.FAILED)
    third = submit(user, name="c")
    run_finish(run=third, status=RunStatus.SUCCEEDED)
    fourth = submit(user, name="d")
    assert fourth.status == RunStatus.STARTING
    fifth = submit(user, name="e")
    run_finish(run=fourth, status=RunStatus.SUCCEEDED)
    assert Run.objects.get(pk=fifth.pk).status == RunStatus.STARTING


class Refused(Exception):
    pass


def hold_grant_lock(*, until: threading.Event, rollback: bool = False) -> threading.Thread:
    """A thread that takes the grant lock in a transaction and ends it once `until` is set (commits, or with
    `rollback` raises out of it, as a refused submit or cancel does); returned once it holds the lock."""
    holding = threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                store.slots_lock()
                holding.set()
                assert until.wait(15)
                if rollback:
                    raise Refused
        except Refused:
            pass
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
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    first, second = submit(user, name="a"), submit(user, name="b")
    release_done = threading.Event()
    thread = hold_grant_lock(until=release_done)
    run_finish(run=first, status=RunStatus.SUCCEEDED)  # commits; its try-lock fails; returns
    assert Run.objects.get(pk=second.pk).status == RunStatus.QUEUED
    release_done.set()
    thread.join(15)
    # The holder committed and, before its thread ended, checked: the freed slot went to `second`.
    assert Run.objects.get(pk=second.pk).status == RunStatus.STARTING
    assert handoffs.dispatched[-1] == second.pk


@pytest.mark.django_db(transaction=True)
def test_a_release_blocked_by_a_holder_that_rolls_back_is_granted_without_a_tick(user, handoffs):
    """The same race with a holder that rolls back (found by the fair-share stress test): it committed nothing,
    but the releaser left its grant to it, so it catches up all the same (runs/slots/pgengine)."""
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    first, second = submit(user, name="a"), submit(user, name="b")
    release_done = threading.Event()
    thread = hold_grant_lock(until=release_done, rollback=True)
    run_finish(run=first, status=RunStatus.SUCCEEDED)
    assert Run.objects.get(pk=second.pk).status == RunStatus.QUEUED
    release_done.set()
    thread.join(15)
    assert Run.objects.get(pk=second.pk).status == RunStatus.STARTING
    assert handoffs.dispatched[-1] == second.pk and _lock_free_elsewhere()


@pytest.mark.django_db(transaction=True)
def test_a_rollback_catches_up_once_after_the_block_and_only_if_it_took_the_lock(user, monkeypatch):
    seen: list[tuple[bool, bool]] = []  # (in an atomic block, autocommit) when the catch-up runs
    state = lambda: (connection.in_atomic_block, connection.autocommit)  # noqa: E731
    monkeypatch.setattr(store, "after_rollback", lambda: seen.append(state()))
    with pytest.raises(Refused), transaction.atomic():
        Run.objects.count()
        raise Refused
    assert seen == []  # no lock taken: nothing owed
    with pytest.raises(Refused), transaction.atomic():
        store.slots_lock()
        store.slots_lock()
        with transaction.atomic():
            store.slots_lock()
        raise Refused
    assert seen == [(False, True)] and not connection.catch_up_due and _lock_free_elsewhere()


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


def _idle_and_lock_free() -> bool:
    return connection.connection.info.transaction_status == TransactionStatus.IDLE and _lock_free_elsewhere()


@pytest.mark.django_db(transaction=True)
def test_a_failed_catch_up_pass_leaves_the_lock_free(user, handoffs, monkeypatch):
    settings_update(changes={"max_total": 1}, partial=True, by=None)
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
    settings_update(changes={"max_total": 1}, partial=True, by=None)
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
    settings_update(changes={"max_total": 1}, partial=True, by=None)
    first, second, third = submit(user, name="a"), submit(user, name="b"), submit(user, name="c")

    def broken(*args, **kwargs):
        raise RuntimeError("publish failed")

    with monkeypatch.context() as patched:
        patched.setattr(lifecycle, "moved_publish", broken)
        with pytest.raises(RuntimeError, match="publish failed"):
            run_finish(run=first, status=RunStatus.SUCCEEDED)
    assert _idle_and_lock_free() and Run.objects.get(pk=second.pk).status == RunStatus.STARTING
    assert run_finish(run=first, status=RunStatus.FAILED).status == RunStatus.SUCCEEDED  # a no-op
    assert _idle_and_lock_free() and Run.objects.get(pk=third.pk).status == RunStatus.QUEUED
