"""WriteBehind: buffered single-item puts are sent in order, in batches, and a failed send is not swallowed."""

import threading

import pytest

from rollout.channel.writer import WriteBehind
from tests.wait import wait_until


def test_puts_are_batched_in_order_and_flush_waits():
    sent: list = []
    w = WriteBehind(lambda runs: sent.extend(runs), linger_s=0.05)
    for i in range(5):
        w.add([(i, 0.0)], "a")
    w.add([("x", 1.0)], "b")
    w.add([(5, 0.0)], "a")
    w.flush()
    assert sent == [("a", [(i, 0.0) for i in range(5)]), ("b", [("x", 1.0)]), ("a", [(5, 0.0)])]
    w.close()


def test_background_thread_sends_after_linger_and_at_max_items():
    sent: list = []
    done = threading.Event()

    def send(runs):
        sent.extend(runs)
        done.set()

    w = WriteBehind(send, linger_s=0.02, max_items=1000)
    w.add([(1, 0.0)], "k")
    assert done.wait(5) and sent == [("k", [(1, 0.0)])]
    sent.clear()
    done.clear()
    big = WriteBehind(send, linger_s=60.0, max_items=3)  # a long linger: only the size bound triggers
    big.add([(i, 0.0) for i in range(3)], "k")
    assert done.wait(5) and sum(len(e) for _, e in sent) == 3
    w.close()
    big.close()


def test_failed_send_is_raised_to_the_producer():
    failing = threading.Event()
    failing.set()

    def send(runs):
        if failing.is_set():
            raise ConnectionError("channel actor gone")

    w = WriteBehind(send, linger_s=0.01)
    w.add([(1, 0.0)], "k")

    def next_put_raises() -> bool:  # each put that does not raise ran before the background send failed
        try:
            w.add([(2, 0.0)], "k")
        except ConnectionError as exc:
            assert "actor gone" in str(exc)
            return True
        return False

    wait_until(next_put_raises, timeout=10, what="a put to raise the background send's failure")
    # Puts buffered while waiting may be in a batch failing right now: let the channel recover and settle them.
    failing.clear()
    try:
        w.flush()
    except ConnectionError:
        w.flush()  # that batch's failure is raised once; after it nothing is pending
    failing.set()
    w.add([(3, 0.0)], "k")  # no failure pending: the put is buffered
    with pytest.raises(ConnectionError, match="actor gone"):
        w.flush()
    with pytest.raises(ValueError):
        WriteBehind(send, linger_s=0)
