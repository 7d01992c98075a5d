"""WriteBehind: buffered single-item puts are sent in order, in batches, and a failed send is not swallowed."""
import threading
import time

import pytest

from rollout.channel.writer import WriteBehind


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
    def send(runs):
        raise ConnectionError("channel actor gone")

    w = WriteBehind(send, linger_s=0.01)
    w.add([(1, 0.0)], "k")
    time.sleep(0.2)  # the background send fails
    with pytest.raises(ConnectionError, match="actor gone"):
        w.add([(2, 0.0)], "k")
    w.add([(3, 0.0)], "k")
    with pytest.raises(ConnectionError):
        w.flush()
    with pytest.raises(ValueError):
        WriteBehind(send, linger_s=0)
