"""The quiet-machine locks (tests/quiet.py), in threads on a directory of their own: a timing test waits for
the test beside that is running, and no test beside starts until the timing test has ended."""

from __future__ import annotations

import threading
import time

from tests.quiet import beside, quiet


def test_a_timing_test_waits_for_the_running_test_beside_and_holds_back_the_next(tmp_path):
    events: list[str] = []
    running = threading.Event()
    release = threading.Event()

    def first_beside() -> None:
        with beside(tmp_path):
            events.append("beside 1 runs")
            running.set()
            release.wait(10)
            events.append("beside 1 ends")

    def timing() -> None:
        with quiet(tmp_path) as waited:
            events.append(f"timing runs after {waited:.1f} s")
            time.sleep(0.3)
            events.append("timing ends")

    def second_beside() -> None:
        with beside(tmp_path):
            events.append("beside 2 runs")

    threads = [threading.Thread(target=first_beside)]
    threads[0].start()
    assert running.wait(10)
    threads.append(threading.Thread(target=timing))
    threads[1].start()
    time.sleep(0.3)  # the timing test now waits at quiet.held with the gate closed
    threads.append(threading.Thread(target=second_beside))
    threads[2].start()
    time.sleep(0.3)
    assert events == ["beside 1 runs"], events
    release.set()
    for t in threads:
        t.join(10)
    assert [e.split(" after")[0] for e in events] == [
        "beside 1 runs",
        "beside 1 ends",
        "timing runs",
        "timing ends",
        "beside 2 runs",
    ]
    assert float(events[2].split("after ")[1].split()[0]) >= 0.5


def test_tests_beside_run_together_and_a_lone_timing_test_does_not_wait(tmp_path):
    with beside(tmp_path), beside(tmp_path):
        pass  # shared: two at once (the suite's single test beside, twice, would not block itself)
    with quiet(tmp_path) as waited:
        assert waited < 1
