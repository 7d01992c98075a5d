"""Property of the outbox's drainer (runs/outbox/drain.py): whatever crashes interrupt it, between whichever two
of its steps, each effect ends done exactly once.

Effects of both ways are stored in one move's transaction: sent ones (a launch: the task is a message to a
worker, which a crash cannot take back) and database ones (follow-ups: the task writes to the database, here
a counter on its run). Then a script of drain passes runs against a clock, each pass possibly crashing (the
process dies: nothing after runs, its open transaction rolls back) at the n-th time it reaches one point:

- `claimed`: its claim committed; `sent`: a worker's task sent; `applied`: a database effect's write made;
  `marking`: about to mark an effect done; `marked`: an effect's mark committed (or ended: its transaction);
- or failing (an error, not a crash) at its n-th task call; and the clock moving (1 s, 30 s, one lease).

Then passes run without faults, the clock far ahead, until nothing is pending. Each effect must be done; each
database effect's write applied exactly once; each message sent once, plus once for each crash that fell
between its send and its mark (the only resend there may be, which the receiving task absorbs: a launch finds
its Ray job by submission id).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.db.models import F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runs.models import Run
from runs.outbox import drain
from runs.outbox.drain import effects_drain
from runs.outbox.effects import Dispatch, FollowUps
from runs.outbox.models import Effect, EffectState
from runs.outbox.store import effects_store

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POINTS = ("claimed", "sent", "applied", "marking", "marked")
SENT_IDS = range(1_000_000, 1_000_004)  # runs of the sent effects (no rows: the message carries the id only)

steps = st.one_of(
    st.tuples(st.just("drain"), st.sampled_from((*POINTS, None)), st.integers(0, 3)),
    st.tuples(st.just("fail"), st.none(), st.integers(0, 3)),
    st.tuples(st.just("wait"), st.none(), st.sampled_from((1, 30, drain.LEASE_SECONDS))),
)


class Crash(BaseException):
    """The process dies here."""


class World:
    """What the drainer's tasks do outside it, and the fault planned for the current pass."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.resends: Counter[int] = Counter()
        self.crash: tuple[str, int] | None = None
        self.fail_at: int | None = None
        self.hits: Counter[str] = Counter()
        self.calls = 0

    def plan(self, crash: tuple[str, int] | None = None, fail_at: int | None = None) -> None:
        self.crash, self.fail_at, self.calls = crash, fail_at, 0
        self.hits.clear()

    def reach(self, point: str, run_id: int | None = None) -> None:
        if self.crash is not None and self.crash[0] == point:
            if self.hits[point] == self.crash[1]:
                self.crash = None
                if run_id is not None:  # a sent effect's task went out before this crash: it goes again
                    self.resends[run_id] += 1
                raise Crash(point)
            self.hits[point] += 1

    def task_called(self) -> None:
        self.calls += 1
        if self.calls - 1 == self.fail_at:
            raise ConnectionError("the task failed")

    # The tasks, as the drainer finds them by name.
    def delay(self, run_id: int) -> None:
        self.task_called()
        self.sent.append(run_id)
        self.reach("sent", run_id)

    def run(self, run_id: int, finished_at: str) -> str:
        self.task_called()
        Run.objects.filter(pk=run_id).update(last_seq=F("last_seq") + 1)
        self.reach("applied")
        return "applied"


def instrumented(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    real_claim, real_do, real_finish = drain._claim, drain._do, drain._finish

    def claim(token, **kw):  # type: ignore[no-untyped-def]
        rows = real_claim(token, **kw)
        if rows:
            world.reach("claimed")
        return rows

    def do(row, token, *, now):  # type: ignore[no-untyped-def]
        finished = real_do(row, token, now=now)
        world.reach("marked")
        return finished

    def finish(row, token, state, **kw):  # type: ignore[no-untyped-def]
        world.reach("marking", row.payload["run"] if row.kind == Dispatch.kind else None)
        return real_finish(row, token, state, **kw)

    monkeypatch.setattr(drain, "task_named", lambda name: world)
    monkeypatch.setattr(drain, "_claim", claim)
    monkeypatch.setattr(drain, "_do", do)
    monkeypatch.setattr(drain, "_finish", finish)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sent=st.integers(0, len(SENT_IDS)), here=st.integers(0, 3), script=st.lists(steps, max_size=12))
def test_any_crashes_leave_each_effect_done_exactly_once(user, monkeypatch, sent, here, script):
    Effect.objects.all().delete()
    Run.objects.filter(name="prop").delete()
    runs = [
        Run.objects.create(name="prop", origin="api", run_class="app", kind="test_job", owner=user) for _ in range(here)
    ]
    world = World()
    effects = [Dispatch(run_id=i, at=T0) for i in SENT_IDS[:sent]] + [FollowUps(run_id=r.pk, at=T0) for r in runs]
    with transaction.atomic():  # one move's transaction
        effects_store(effects, now=T0)
    clock = T0
    with monkeypatch.context() as patched:
        instrumented(world, patched)
        for op, point, n in script:
            if op == "wait":
                clock += timedelta(seconds=n)
                continue
            world.plan(crash=(point, n) if point else None, fail_at=n if op == "fail" else None)
            try:
                effects_drain(now=clock)
            except Crash:
                pass
        world.plan()
        for _ in range(5):
            clock += timedelta(hours=2)
            effects_drain(now=clock)

    rows = list(Effect.objects.order_by("id"))
    assert [r.state for r in rows] == [EffectState.DONE] * len(effects), [(r.key, r.state, r.last_error) for r in rows]
    assert all(r.claim == "" and r.done_at is not None for r in rows)
    assert [Run.objects.get(pk=r.pk).last_seq for r in runs] == [1] * here
    assert sorted(world.sent) == sorted(i for i in SENT_IDS[:sent] for _ in range(1 + world.resends[i]))
