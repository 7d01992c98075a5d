"""CallCoalescer (pure asyncio, a plain async object as the callee): the requests of one tick travel in one
batch call and each caller gets exactly its own outcome."""

from __future__ import annotations

import asyncio

import pytest

from rollout.coalesce import CallCoalescer


class Callee:
    """Answers each request with its double; a negative request fails alone; `broken` fails the whole call."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.broken = False
        self.release = asyncio.Event()
        self.release.set()

    async def double_many(self, requests: list[int]) -> list[object]:
        self.batches.append(list(requests))
        await self.release.wait()
        if self.broken:
            raise ConnectionError("actor died")
        return [ValueError(f"bad {r}") if r < 0 else 2 * r for r in requests]


def test_requests_of_one_tick_go_in_one_call_and_each_gets_its_own_answer() -> None:
    async def main() -> tuple[list[object], Callee, CallCoalescer]:
        callee = Callee()
        co = CallCoalescer(callee, "double_many")
        got = await asyncio.gather(*(co.submit(i) for i in range(5)))
        return got, callee, co

    got, callee, co = asyncio.run(main())
    assert got == [0, 2, 4, 6, 8]
    assert callee.batches == [[0, 1, 2, 3, 4]]
    assert co.stats() == {"calls": 1, "requests": 5}


def test_a_failed_request_fails_only_its_caller() -> None:
    async def main() -> list[object]:
        co = CallCoalescer(Callee(), "double_many")
        return await asyncio.gather(co.submit(1), co.submit(-1), co.submit(3), return_exceptions=True)

    got = asyncio.run(main())
    assert got[0] == 2 and got[2] == 6
    assert isinstance(got[1], ValueError) and str(got[1]) == "bad -1"


def test_a_failed_call_fails_every_request_it_carried() -> None:
    async def main() -> list[object]:
        callee = Callee()
        callee.broken = True
        co = CallCoalescer(callee, "double_many")
        return await asyncio.gather(co.submit(1), co.submit(2), return_exceptions=True)

    got = asyncio.run(main())
    assert all(isinstance(e, ConnectionError) for e in got)


def test_later_ticks_make_later_calls_while_one_is_in_flight() -> None:
    async def main() -> tuple[list[object], Callee]:
        callee = Callee()
        callee.release.clear()
        co = CallCoalescer(callee, "double_many")
        first = [asyncio.ensure_future(co.submit(i)) for i in (1, 2)]
        await asyncio.sleep(0.01)  # the first call is in flight, held by the callee
        second = [asyncio.ensure_future(co.submit(i)) for i in (3, 4, 5)]
        await asyncio.sleep(0.01)
        assert callee.batches == [[1, 2], [3, 4, 5]]  # the second tick did not wait for the first call
        callee.release.set()
        return list(await asyncio.gather(*first, *second)), callee

    got, _ = asyncio.run(main())
    assert got == [2, 4, 6, 8, 10]


def test_a_caller_cancelled_before_the_send_is_not_sent_and_one_cancelled_during_it_spoils_nothing() -> None:
    async def main() -> tuple[list[object], Callee]:
        callee = Callee()
        callee.release.clear()
        co = CallCoalescer(callee, "double_many")
        gone = asyncio.ensure_future(co.submit(7))
        await asyncio.sleep(0)  # it reached submit
        gone.cancel()
        kept = [asyncio.ensure_future(co.submit(i)) for i in (1, 2)]
        await asyncio.sleep(0.01)
        kept[0].cancel()  # mid-call
        callee.release.set()
        out = await asyncio.gather(*kept, return_exceptions=True)
        return list(out), callee

    got, callee = asyncio.run(main())
    assert callee.batches == [[1, 2]]
    assert isinstance(got[0], asyncio.CancelledError) and got[1] == 4


def test_an_answer_of_the_wrong_length_fails_every_request() -> None:
    class Short:
        async def double_many(self, requests: list[int]) -> list[int]:
            return [0]

    async def main() -> list[object]:
        co = CallCoalescer(Short(), "double_many")
        return await asyncio.gather(co.submit(1), co.submit(2), return_exceptions=True)

    got = asyncio.run(main())
    assert all(isinstance(e, RuntimeError) and "1 outcomes for 2" in str(e) for e in got)


@pytest.mark.parametrize("n", [1, 40])
def test_every_caller_is_answered_whatever_the_batch_size(n: int) -> None:
    async def main() -> list[object]:
        co = CallCoalescer(Callee(), "double_many")
        return list(await asyncio.gather(*(co.submit(i) for i in range(n))))

    assert asyncio.run(main()) == [2 * i for i in range(n)]


def test_single_flight_holds_later_ticks_until_the_call_in_flight_returns_then_sends_them_together() -> None:
    async def main() -> tuple[list[object], Callee]:
        callee = Callee()
        callee.release.clear()
        co = CallCoalescer(callee, "double_many", single_flight=True)
        first = [asyncio.ensure_future(co.submit(i)) for i in (1, 2)]
        await asyncio.sleep(0.01)  # the first call is in flight, held by the callee
        later = [asyncio.ensure_future(co.submit(3))]
        await asyncio.sleep(0.01)
        later.append(asyncio.ensure_future(co.submit(4)))  # another tick, still while the first call runs
        await asyncio.sleep(0.01)
        assert callee.batches == [[1, 2]]  # nothing else sent while one call is in flight
        callee.release.set()
        got = list(await asyncio.gather(*first, *later))
        assert co.stats() == {"calls": 2, "requests": 4}
        return got, callee

    got, callee = asyncio.run(main())
    assert got == [2, 4, 6, 8]
    assert callee.batches == [[1, 2], [3, 4]]


def test_single_flight_after_a_failed_call_still_sends_what_waited() -> None:
    class FailsFirst(Callee):
        async def double_many(self, requests: list[int]) -> list[object]:
            self.broken = not self.batches  # only the first call fails
            return await super().double_many(requests)

    async def main() -> tuple[list[object], Callee]:
        callee = FailsFirst()
        _, failed, waiting = await _one_sent_one_waiting(callee)
        callee.release.set()
        return list(await asyncio.gather(failed, waiting, return_exceptions=True)), callee

    got, callee = asyncio.run(main())
    assert callee.batches == [[1], [2]]
    assert isinstance(got[0], ConnectionError) and got[1] == 4


def test_single_flight_a_cancelled_call_cancels_what_waited_for_it_instead_of_sending_it() -> None:
    async def main() -> tuple[list[object], Callee]:
        callee = Callee()
        co, first, waiting = await _one_sent_one_waiting(callee)
        for task in list(co._sends):  # as the loop's shutdown cancels the sending task
            task.cancel()
        got = list(await asyncio.gather(first, waiting, return_exceptions=True))
        await asyncio.sleep(0.01)
        return got, callee

    got, callee = asyncio.run(main())
    assert all(isinstance(g, asyncio.CancelledError) for g in got)
    assert callee.batches == [[1]]  # the waiting request was never sent


async def _one_sent_one_waiting(callee: Callee) -> tuple[CallCoalescer, asyncio.Future[object], asyncio.Future[object]]:
    """A single-flight coalescer with request 1 in flight (held by the callee) and request 2 waiting behind it."""
    callee.release.clear()
    co = CallCoalescer(callee, "double_many", single_flight=True)
    first = asyncio.ensure_future(co.submit(1))
    await asyncio.sleep(0.01)
    waiting = asyncio.ensure_future(co.submit(2))
    await asyncio.sleep(0.01)
    return co, first, waiting
