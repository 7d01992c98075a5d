"""RolloutScheduler with in-process fake workers: batches, filters, backpressure, pause, state, failures."""

import threading

import pytest

from rollout.errors import (
    NoWorkerLeftError,
    QuiesceTimeoutError,
    SchedulerClosedError,
    SchedulerStateError,
    WorkerLostError,
)
from rollout.filters import MinValidAttemptsFilter, ZeroVarianceFilter
from rollout.scheduler import RolloutScheduler
from rollout.types import GroupResult
from tests.rollout.fakes import CountingSource, InstantWorker, ManualWorker, PooledWorker, default_result, wait_until


def test_generate_returns_exactly_batch_size_replacing_filtered_groups():
    source = CountingSource()
    s = RolloutScheduler(
        [InstantWorker(), InstantWorker()], [2, 2], source, batch_size=6, filters=[ZeroVarianceFilter()]
    )
    try:
        batch = s.generate("b0", prefetch=0)
        ids = [g.group_id for g in batch.groups]
        assert ids == [0, 3, 6, 9, 12, 15]  # groups with equal rewards were replaced
        assert batch.dropped == {"zero_variance": 10}
        assert batch.dropped_ratio == pytest.approx(10 / 16)
        assert batch.metrics["rollout/drop_zero_variance"] == batch.dropped["zero_variance"]
        assert s.generate("b1", prefetch=0).batch_id == "b1"
    finally:
        s.close()


def test_aborted_groups_go_back_to_the_source_and_are_redone():
    aborted_once: set[int] = set()

    def make(group):
        if group % 4 == 0 and group not in aborted_once:
            aborted_once.add(group)
            return GroupResult(rewards=[], aborted=True, group_id=group)
        return GroupResult(rewards=[0.0, 1.0], group_id=group)

    source = CountingSource()
    s = RolloutScheduler([InstantWorker(make)], [1], source, batch_size=8)
    try:
        ids = [g.group_id for g in s.generate(0).groups] + [g.group_id for g in s.generate(1).groups]
        assert sorted(ids) == list(range(16)) and len(set(ids)) == 16
        assert source.returned == [0, 4, 8, 12]
    finally:
        s.close()


def test_prefetch_bound_applies_backpressure_when_trainer_is_slow():
    worker = ManualWorker()
    source = CountingSource()
    s = RolloutScheduler([worker], [8], source, batch_size=2)
    try:
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("b", s.generate(0, prefetch=3)))
        t.start()
        wait_until(lambda: len(worker.open_groups()) == 5)  # demand 2 + prefetch 3
        assert s.stats()["pending"] == 5
        for g in worker.open_groups():
            worker.finish(g)
        t.join(30)
        assert len(result["b"].groups) == 2
        # Trainer is busy: nothing beyond the prefetch is generated.
        wait_until(lambda: s.stats()["pending"] + s.stats()["ready"] == 3)
        assert len(worker.open_groups()) == 0 and s.stats()["ready"] == 3 and source.handed_out == 5
        next_batch = s.generate(1, prefetch=3)
        assert [g.group_id for g in next_batch.groups] == [2, 3]
    finally:
        s.close()


def test_pause_with_drain_returns_only_after_in_flight_settles():
    worker = ManualWorker()
    s = RolloutScheduler([worker], [3], CountingSource(), batch_size=10)
    try:
        threading.Thread(target=lambda: _swallow(lambda: s.generate(0)), daemon=True).start()
        wait_until(lambda: len(worker.open_groups()) == 3)
        done = threading.Event()
        threading.Thread(target=lambda: (s.pause(drain=True), done.set()), daemon=True).start()
        assert not done.wait(0.1)
        for g in worker.open_groups():
            worker.finish(g)
        assert done.wait(30)
        assert s.stats()["pending"] == 0 and worker.open_groups() == []
        with pytest.raises(SchedulerStateError, match="being collected"):
            s.state_dict()  # the interrupted generate still holds its partial batch
    finally:
        s.close()


def test_quiesce_finishes_or_rebuffers_by_the_deadline_and_fails_when_an_abort_never_lands():
    worker = ManualWorker()
    source = CountingSource()
    s = RolloutScheduler([worker], [4], source, batch_size=1)
    try:
        batch = threading.Thread(target=lambda: s.generate(0, prefetch=4), daemon=True)
        batch.start()  # demand 1 + prefetch 4, capped by the worker's capacity: 4 in flight
        wait_until(lambda: len(worker.open_groups()) == 4)
        worker.finish(worker.open_groups()[0])  # delivers the batch; the prefetch refills to 4 in flight
        batch.join(30)
        wait_until(lambda: len(worker.open_groups()) == 4)
        first, second, *rest = worker.open_groups()
        worker.finish(first)  # finished before quiesce: it stays ready (prefetch bound: no refill)
        wait_until(lambda: s.stats()["ready"] == 1 and s.stats()["pending"] == 3)

        def abort() -> None:  # the workers stop their episodes between turns: aborted results
            for g in rest:
                worker.finish(g, GroupResult(rewards=[], aborted=True, group_id=g))

        with pytest.raises(QuiesceTimeoutError, match="1 of 3 in-flight"):
            s.quiesce(0.05, abort=abort, grace_s=0.05)  # `second` never answers
        assert s.stats()["paused"] and s.stats()["pending"] == 1
        worker.finish(second)  # late: a second quiesce (the next checkpoint) finds it in flight or ready
        counts = s.quiesce(5, abort=lambda: None)
        assert counts["rebuffered"] == 0 and counts["finished"] == counts["in_flight"]
        ready = [result.group_id for _, result, _ in s.state_dict()["ready"]]
        assert sorted(ready + source.returned) == sorted([first, second, *rest])  # each once
        assert worker.open_groups() == []
        assert source.returned == sorted(rest)
    finally:
        s.close()


def _swallow(fn):
    try:
        fn()
    except Exception:  # noqa: BLE001 - generate is interrupted by close()
        pass


def test_state_dict_only_when_paused_and_load_only_before_start():
    worker = ManualWorker()
    s = RolloutScheduler([worker], [2], CountingSource(), batch_size=1)
    try:
        with pytest.raises(SchedulerStateError, match="paused"):
            s.resume() or s.state_dict()
        s.pause(drain=False)
        t = threading.Thread(target=lambda: s.generate(0, prefetch=1))
        t.start()
        wait_until(lambda: len(worker.open_groups()) == 2)
        worker.finish(0)
        t.join(30)
        s.pause(drain=False)
        with pytest.raises(SchedulerStateError, match="still in flight"):
            s.state_dict()
        with pytest.raises(SchedulerStateError, match="before the first generate"):
            s.load_state_dict({"ready": [], "seq": 0})
        worker.finish(1)
        s.pause(drain=True)
        assert [r.group_id for _, r, _ in s.state_dict()["ready"]] == [1]
    finally:
        s.close()


def test_pause_state_dict_load_round_trip_reproduces_next_batch():
    def run_until_checkpoint():
        source = CountingSource()
        s = RolloutScheduler(
            [InstantWorker(), InstantWorker()], [3, 3], source, batch_size=4, filters=[ZeroVarianceFilter()]
        )
        s.generate(0, prefetch=5)
        s.pause(drain=True)
        return s, source, s.state_dict(), source.state_dict()

    s, source, sched_state, source_state = run_until_checkpoint()
    assert len(sched_state["ready"]) >= 1
    s.resume()
    expected = [(g.group_id, g.rewards) for g in s.generate(1, prefetch=5).groups]
    s.close()

    source2 = CountingSource()
    source2.load_state_dict(source_state)
    s2 = RolloutScheduler(
        [InstantWorker(), InstantWorker()], [3, 3], source2, batch_size=4, filters=[ZeroVarianceFilter()]
    )
    s2.load_state_dict(sched_state)
    try:
        assert [(g.group_id, g.rewards) for g in s2.generate(1, prefetch=5).groups] == expected
    finally:
        s2.close()


def test_lost_worker_is_retired_and_its_groups_redone_elsewhere():
    slow_dead = PooledWorker(delay=lambda g: 30.0)  # never finishes before it is killed
    fast = PooledWorker(delay=lambda g: 0.002)
    source = CountingSource()
    s = RolloutScheduler([slow_dead, fast], [2, 2], source, batch_size=6)
    try:
        threading.Timer(0.05, slow_dead.dead.set).start()
        batch = s.generate(0)
        ids = [g.group_id for g in batch.groups]
        assert len(ids) == len(set(ids)) == 6
        stats = s.stats()
        assert stats["capacities"] == [0, 2] and stats["workers_alive"] == 1
        assert len(source.returned) == 2  # the two groups the dead worker held
        assert set(source.returned) <= set(ids)  # ... were generated again by the live worker
    finally:
        s.close()


def test_no_worker_left_raises_and_returns_every_group():
    worker = PooledWorker(delay=lambda g: 30.0)
    source = CountingSource()
    s = RolloutScheduler([worker], [3], source, batch_size=4)
    threading.Timer(0.05, worker.dead.set).start()
    with pytest.raises(NoWorkerLeftError):
        s.generate(0)
    assert sorted(source.returned) == [0, 1, 2]
    with pytest.raises(NoWorkerLeftError):
        s.generate(1)
    s.close()


def test_worker_exception_is_raised_and_group_returned():
    def make(group):
        if group == 2:
            raise ValueError("reward function crashed")
        return default_result(group)

    source = CountingSource()
    s = RolloutScheduler([InstantWorker(make)], [1], source, batch_size=5)
    with pytest.raises(RuntimeError, match="reward function crashed"):
        s.generate(0)
    assert 2 in source.returned
    s.close()


def test_close_returns_in_flight_groups_and_refuses_more_work():
    worker = ManualWorker()
    source = CountingSource()
    s = RolloutScheduler([worker], [4], source, batch_size=8)
    threading.Thread(target=lambda: _swallow(lambda: s.generate(0)), daemon=True).start()
    wait_until(lambda: len(worker.open_groups()) == 4)
    s.close(timeout_s=2)
    assert sorted(source.returned) == [0, 1, 2, 3]
    with pytest.raises(SchedulerClosedError):
        s.generate(1)


def test_exhausted_source_is_an_error_not_a_hang():
    s = RolloutScheduler([InstantWorker()], [2], CountingSource(limit=3), batch_size=5)
    with pytest.raises(SchedulerStateError, match="exhausted"):
        s.generate(0)
    s.close()


def test_min_valid_attempts_filter_in_scheduler():
    def make(group):
        valid = [True, group % 2 == 0, True]
        return GroupResult(rewards=[0.0, 1.0, 0.5], valid=valid, attempt_ids=["a", "b", "a"], group_id=group)

    s = RolloutScheduler(
        [InstantWorker(make)], [2], CountingSource(), batch_size=3, filters=[MinValidAttemptsFilter(2)]
    )
    try:
        batch = s.generate(0)
        assert [g.group_id for g in batch.groups] == [0, 2, 4]
        assert batch.dropped == {"min_valid_attempts": 2}
    finally:
        s.close()


def test_bad_configuration_is_rejected():
    with pytest.raises(ValueError, match="capacities"):
        RolloutScheduler([InstantWorker()], [0], CountingSource(), batch_size=1)
    with pytest.raises(ValueError, match="2 workers but 1"):
        RolloutScheduler([InstantWorker(), InstantWorker()], [1], CountingSource(), batch_size=1)
    with pytest.raises(WorkerLostError.__mro__[1]):
        raise WorkerLostError("w")


def test_retire_worker_by_owner_moves_work_and_last_one_raises():
    slow, fast = ManualWorker(), InstantWorker()
    source = CountingSource()
    s = RolloutScheduler([slow, fast], [2, 1], source, batch_size=4)
    try:
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("b", s.generate(0)))
        t.start()
        wait_until(lambda: len(slow.open_groups()) == 2)
        s.retire_worker(0, "node draining")
        t.join(30)
        assert len(out["b"].groups) == 4 and s.stats()["capacities"] == [0, 1]
        assert sorted(source.returned) == slow.open_groups()  # its unfinished groups went back
        with pytest.raises(NoWorkerLeftError):
            s.retire_worker(1)
        with pytest.raises(NoWorkerLeftError):
            s.generate(1)
    finally:
        s.close()
