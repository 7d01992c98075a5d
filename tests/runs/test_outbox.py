"""The outbox (runs/outbox/): effects are stored with their move and only with it, one row per key; the drainer
sends a worker's effect and then marks it done, runs a database effect in the transaction that marks it done
(a refusal writes nothing and is its outcome), retries a failure with backoff and gives up after MAX_ATTEMPTS,
takes a row back once the lease of a drainer that died has passed, and leaves a kind it does not know alone.
Database-agnostic (the suite runs it on PostgreSQL; it passes on SQLite too); SKIP LOCKED between concurrent
drainers is PostgreSQL's: tests/runs/test_outbox_pg.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from runs import tasks
from runs.errors import InvalidTransition
from runs.execution import followups
from runs.models import Run
from runs.outbox import drain
from runs.outbox.drain import effects_drain
from runs.outbox.effects import Dispatch, FollowUps, StopJob, effect_load
from runs.outbox.models import Effect, EffectState
from runs.outbox.store import effects_kick, effects_store
from tests.runs.pg_fixtures import submit

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SECOND = timedelta(seconds=1)
LEASE = timedelta(seconds=drain.LEASE_SECONDS)


class Crash(BaseException):
    """The process dies here: nothing after it runs, and its open transaction rolls back."""


def stored(*effects, now: datetime = T0) -> None:
    with transaction.atomic():
        effects_store(list(effects), now=now)


def row(effect) -> Effect:
    return Effect.objects.get(key=effect.key)


def test_an_effect_is_stored_once_per_key_due_at_its_move_and_typed_back(handoffs):
    launch = Dispatch(run_id=7, at=T0)
    stored(launch, StopJob(run_id=7, at=T0))
    stored(launch)  # the same move's effect stored again: still one effect
    assert Effect.objects.count() == 2
    got = row(launch)
    assert (got.kind, got.payload, got.state, got.attempts, got.next_attempt_at, got.created_at) == (
        "dispatch",
        {"run": 7, "at": T0.isoformat()},
        EffectState.PENDING,
        0,
        T0,
        T0,
    )
    assert effect_load(got.kind, got.payload) == launch
    assert Dispatch(run_id=7, at=T0 + SECOND).key != launch.key  # a later grant of the run: another launch


@pytest.mark.django_db(transaction=True)
def test_effects_are_written_in_their_moves_transaction_and_roll_back_with_it(handoffs):
    launch = Dispatch(run_id=1, at=T0)
    with pytest.raises(RuntimeError, match="transaction"):
        effects_store([launch], now=T0)
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        effects_store([launch], now=T0)
        effects_kick([launch])
        _ = 1 / 0
    assert not Effect.objects.exists() and handoffs.dispatched == []


@pytest.mark.django_db(transaction=True)
def test_a_commit_sends_its_workers_effects_at_once_and_marks_them_done(handoffs):
    launch, stop = Dispatch(run_id=3, at=T0), StopJob(run_id=4, at=T0)
    with transaction.atomic():
        effects_store([launch, stop], now=timezone.now())
        effects_kick([launch, stop])
        assert handoffs.dispatched == []  # nothing before the commit
    assert (handoffs.dispatched, handoffs.stopped) == ([3], [4])
    done = [(r.state, r.outcome, r.attempts, r.claim) for r in Effect.objects.order_by("id")]
    assert done == [(EffectState.DONE, "sent", 1, "")] * 2
    assert all(r.done_at is not None for r in Effect.objects.all())
    assert effects_drain() == [] and (handoffs.dispatched, handoffs.stopped) == ([3], [4])


def test_a_failing_send_is_retried_with_backoff_then_given_up(handoffs, monkeypatch):
    monkeypatch.setattr(drain, "MAX_ATTEMPTS", 3)

    def broker_down(run_id: int) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(tasks.dispatch_run, "delay", broker_down)
    launch = Dispatch(run_id=5, at=T0)
    stored(launch)
    assert effects_drain(now=T0) == []
    got = row(launch)
    assert (got.state, got.attempts, got.next_attempt_at, got.claim) == (EffectState.PENDING, 1, T0 + SECOND, "")
    assert got.last_error == "ConnectionError: broker down"
    assert effects_drain(now=T0 + SECOND / 2) == [] and row(launch).attempts == 1  # not due yet
    assert effects_drain(now=T0 + SECOND) == []
    assert (row(launch).attempts, row(launch).next_attempt_at) == (2, T0 + 3 * SECOND)  # 1 s, then 2 s
    assert effects_drain(now=T0 + 3 * SECOND) == [launch.key]  # the third attempt fails too: given up
    got = row(launch)
    assert (got.state, got.attempts, got.done_at is not None) == (EffectState.FAILED, 3, True)
    assert effects_drain(now=T0 + timedelta(days=1)) == []


def touching(outcome: str | None, calls: list[int]):
    """A follow-ups body that writes to its run, then answers `outcome` (None: refuses, the run moved on)."""

    def run_followups(*, run_id: int, finished_at: datetime) -> str:
        calls.append(run_id)
        Run.objects.filter(pk=run_id).update(name=f"followed {finished_at:%S}")
        if outcome is None:
            raise InvalidTransition(f"run {run_id} moved on")
        return outcome

    return run_followups


def test_a_database_effect_commits_with_its_mark_and_a_refusal_writes_nothing(user, handoffs, monkeypatch):
    run, calls = submit(user, name="t"), []
    monkeypatch.setattr(followups, "run_followups", touching(None, calls))
    refused = FollowUps(run_id=run.pk, at=T0)
    stored(refused)
    assert refused.key in effects_drain(now=T0)
    assert (row(refused).state, row(refused).outcome) == (EffectState.DONE, f"refused: run {run.pk} moved on")
    assert Run.objects.get(pk=run.pk).name == "t" and calls == [run.pk]  # its write rolled back

    monkeypatch.setattr(followups, "run_followups", touching("evaluation submitted", calls))
    applied = FollowUps(run_id=run.pk, at=T0 + SECOND)
    stored(applied)
    assert effects_drain(now=T0 + SECOND) == [applied.key]
    assert (row(applied).state, row(applied).outcome) == (EffectState.DONE, "evaluation submitted")
    assert Run.objects.get(pk=run.pk).name == "followed 01"


def test_a_row_whose_drainer_died_is_taken_back_once_its_lease_has_passed(user, handoffs, monkeypatch):
    run, calls = submit(user, name="t"), []
    dies = touching("done here", calls)

    def dies_the_first_time(*, run_id: int, finished_at: datetime) -> str:
        outcome = dies(run_id=run_id, finished_at=finished_at)
        if len(calls) == 1:
            raise Crash
        return outcome

    monkeypatch.setattr(followups, "run_followups", dies_the_first_time)
    effect = FollowUps(run_id=run.pk, at=T0)
    stored(effect)
    with pytest.raises(Crash):
        effects_drain(keys=[effect.key], now=T0)
    got = row(effect)
    assert (got.state, got.attempts, got.next_attempt_at, bool(got.claim)) == (EffectState.PENDING, 1, T0 + LEASE, True)
    assert Run.objects.get(pk=run.pk).name == "t"  # the write died with its transaction
    assert effects_drain(keys=[effect.key], now=T0 + LEASE - SECOND) == []  # still held by the dead drainer
    assert effects_drain(keys=[effect.key], now=T0 + LEASE) == [effect.key]
    got = row(effect)
    assert (got.state, got.attempts, got.outcome, got.claim) == (EffectState.DONE, 2, "done here", "")
    assert Run.objects.get(pk=run.pk).name == "followed 00" and calls == [run.pk, run.pk]


def test_a_kind_this_code_does_not_know_waits_and_a_malformed_payload_is_given_up(handoffs):
    Effect.objects.create(kind="future", key="future:1", payload={}, next_attempt_at=T0, created_at=T0)
    Effect.objects.create(kind="dispatch", key="dispatch:x", payload={"run": "1"}, next_attempt_at=T0, created_at=T0)
    assert effects_drain(now=T0) == ["dispatch:x"]
    states = dict(Effect.objects.values_list("key", "state"))
    assert states == {"future:1": EffectState.PENDING, "dispatch:x": EffectState.FAILED}
    assert "cannot be done" in Effect.objects.get(key="dispatch:x").last_error and handoffs.dispatched == []


def test_a_kick_drains_only_its_own_commits_effects(handoffs, django_capture_on_commit_callbacks):
    left = Dispatch(run_id=1, at=T0)
    stored(left)  # a crash kept this one from being done after its commit
    with django_capture_on_commit_callbacks(execute=True):
        mine = Dispatch(run_id=2, at=T0)
        stored(mine)
        effects_kick([mine])
    assert handoffs.dispatched == [2] and row(left).state == EffectState.PENDING
    assert effects_drain() == [left.key] and handoffs.dispatched == [2, 1]  # the tick's drain
