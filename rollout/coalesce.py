"""One remote call per event-loop tick: calls to one actor made in the same tick travel as one batched call.

A caller awaits `coalescer.submit(request)` and gets its own answer (or its own exception), as if it had made
the call alone. Every request submitted before the next tick of the loop goes in one call of the handle's batch
method, `method(requests) -> outcomes`: one outcome per request, in order, an exception instance standing for
that request's failure (the shape of `asyncio.gather(..., return_exceptions=True)`). A failure of the batch
call itself (a dead actor, a cancelled call) is every request's failure. Why: a Ray actor call costs the caller
a task submission and the callee a task and its deserialisation, whatever it carries; per request, that was a
third of a rollout worker's CPU (docs/trainer.md, "Coalesced turns").

`single_flight=True`: at most one call in flight; what is submitted while it runs goes in the next call, sent
when it returns. For short bookkeeping calls (a rollout worker ending its sessions on the session server) whose
callers arrive one or two per tick: they then share calls across ticks (a digit-task worker's `end_many` carried
1.9 groups per call per tick, 2.9 single-flight).
Not for generation, where a request must reach the engine's running batch at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rollout.invoke import call


class CallCoalescer:
    """Batches the requests submitted to one handle in one event-loop tick into one `method` call."""

    def __init__(self, handle: Any, method: str, *, single_flight: bool = False) -> None:
        self.handle, self.method, self.single_flight = handle, method, single_flight
        self._pending: list[tuple[Any, asyncio.Future[Any]]] = []
        self._sends: set[asyncio.Task[None]] = set()  # strong references: a bare task may be collected mid-call
        self.calls = 0  # batch calls made
        self.requests = 0  # requests they carried

    async def submit(self, request: Any) -> Any:
        """This request's outcome: its answer, or its exception raised here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._pending and not (self.single_flight and self._sends):
            loop.call_soon(self._flush)  # the first of this tick: send them all once the tick's other callers ran
        self._pending.append((request, future))
        return await future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        batch = [(r, f) for r, f in batch if not f.cancelled()]  # callers gone before the send: not sent
        if not batch:
            return
        self.calls += 1
        self.requests += len(batch)
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._sends.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sends.discard(task)
        if not (self.single_flight and self._pending):
            return
        if task.cancelled():  # the loop is shutting down: what waited for this call is cancelled with it
            batch, self._pending = self._pending, []
            for _, future in batch:
                future.cancel()
            return
        self._flush()  # submitted while the call ran: they go now, in one call

    async def _send(self, batch: list[tuple[Any, asyncio.Future[Any]]]) -> None:
        try:
            outcomes = await call(self.handle, self.method, [request for request, _ in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"{self.method} answered {len(outcomes)} outcomes for {len(batch)} requests")
        except asyncio.CancelledError:  # the sending task was cancelled (loop shutdown): so are its callers
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - the batch call's failure is each request's failure
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), outcome in zip(batch, outcomes):
            if future.done():  # its caller was cancelled while the call ran
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def stats(self) -> dict[str, int]:
        return {"calls": self.calls, "requests": self.requests}
