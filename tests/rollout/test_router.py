"""SessionAffinityRouter: least-loaded binding, stickiness, tombstones (bounded, expiring), capacity."""

import threading

import pytest

from rollout.errors import NoEngineError, RouterFullError, SessionGoneError
from rollout.router import SessionAffinityRouter


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_new_sessions_go_to_least_loaded_and_stay():
    r = SessionAffinityRouter(["a", "b"])
    assert [r.acquire(s) for s in ("s1", "s2", "s3", "s4")] == ["a", "b", "a", "b"]
    assert r.acquire("s1") == "a" and r.acquire("s2") == "b"
    r.release("s1")
    r.release("s3")
    assert r.in_flight() == {"a": 0, "b": 2}
    assert r.acquire("s5") == "a"
    assert r.retire_sessions(["s2", "s4", "unknown"]) == 2
    assert r.in_flight() == {"a": 1, "b": 0}


def test_killed_engine_turns_sessions_into_tombstones():
    r = SessionAffinityRouter(["a", "b"])
    for s in ("s1", "s2", "s3", "s4"):
        r.acquire(s)
    gone = r.remove_engine("a", reason="actor died")
    assert sorted(gone) == ["s1", "s3"]
    with pytest.raises(SessionGoneError) as info:
        r.acquire("s1")
    assert info.value.engine == "a" and "actor died" in str(info.value)
    assert r.acquire("s2") == "b"  # sessions elsewhere are unaffected
    assert r.acquire("new") == "b"  # new sessions avoid the dead engine
    assert r.snapshot()["tombstones"] == 2
    r.release("s3")  # the owner acknowledges: the tombstone is forgotten
    assert r.snapshot()["tombstones"] == 1


def test_tombstones_expire_and_are_bounded():
    clock = Clock()
    r = SessionAffinityRouter(["a", "b"], tombstone_ttl_s=10, max_tombstones=3, clock=clock)
    for i in range(6):
        r.acquire(f"s{i}")  # a gets s0 s2 s4, b gets s1 s3 s5
    r.remove_engine("a")
    clock.now = 5
    r.remove_engine("b")
    assert r.snapshot()["tombstones"] == 3  # oldest evicted past max_tombstones
    with pytest.raises(SessionGoneError):
        r.acquire("s5")
    clock.now = 16
    assert r.snapshot()["tombstones"] == 0
    r.add_engine("c")
    assert r.acquire("s5") == "c"  # expired: treated as a new session


def test_full_router_and_no_engine_errors():
    r = SessionAffinityRouter(["a"], max_sessions=2)
    r.acquire("s1")
    r.acquire("s2")
    with pytest.raises(RouterFullError, match="maximum of 2"):
        r.acquire("s3")
    assert r.acquire("s1") == "a"  # existing sessions still route
    with pytest.raises(NoEngineError):
        SessionAffinityRouter([]).acquire("s")


def test_concurrent_acquire_binds_each_session_once():
    r = SessionAffinityRouter(["a", "b", "c"])
    results: dict[str, set[str]] = {}
    lock = threading.Lock()

    def worker(offset: int):
        for i in range(300):
            sid = f"s{(i + offset) % 150}"
            engine = r.acquire(sid)
            with lock:
                results.setdefault(sid, set()).add(engine)

    threads = [threading.Thread(target=worker, args=(k * 7,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(v) == 1 for v in results.values())
    assert sum(r.in_flight().values()) == 150 and max(r.in_flight().values()) - min(r.in_flight().values()) <= 1


def test_new_sessions_go_to_the_engine_with_fewest_requests_in_flight():
    r = SessionAffinityRouter(["a", "b"])
    assert r.acquire("s1") == "a"
    r.request_started("a")
    r.request_started("a")
    assert r.acquire("s2") == "b"  # a has two requests in flight from here
    r.request_started("b")
    r.request_finished("a")
    r.request_finished("a", reported=5)  # a says 5 others are in flight there (none of them ours now)
    assert r.requests_in_flight() == {"a": 5, "b": 1}
    assert r.acquire("s3") == "b" and r.acquire("s1") == "a"  # bound sessions never move
    r.request_finished("b", reported=0)
    r.request_finished("a", reported=0)  # an extra finish never goes negative
    assert r.requests_in_flight() == {"a": 0, "b": 0}
    assert r.acquire("s4") == "a"  # a tie on requests: fewer bound sessions (a: s1, b: s2 s3)
    r.request_started("gone")  # unknown engines are ignored
    r.request_finished("gone", reported=3)
    assert r.snapshot()["requests_in_flight"] == {"a": 0, "b": 0}


def test_an_engine_that_lost_one_session_tombstones_only_that_one():
    r = SessionAffinityRouter(["a"])
    r.acquire("s1")
    r.acquire("s2")
    r.remove_session("s1", "a", "evicted")
    with pytest.raises(SessionGoneError, match="evicted"):
        r.acquire("s1")
    assert r.acquire("s2") == "a" and r.in_flight() == {"a": 1}
