"""PublicationController: one weight publication across many engines (seal, drain, install, reopen), fail-closed,
and what it cost each engine (`counts()`: leases drained, requests admitted at reopen)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypedDict

from rollout.errors import PublicationError
from rollout.gate import GateState, gate_event_data
from rollout.invoke import call

_DRAIN_GRACE_S = 2.0


class EngineCounts(TypedDict):
    """One engine's share of a publication (the `version` event's `engines` entries)."""

    engine: str
    drained: int  # leases in flight that its drain waited for (RequestGate.drain)
    admitted_at_reopen: int  # requests that waited at its closed gate, admitted at reopen (RequestGate.reopen)


class PublicationCounts(TypedDict):
    """`counts()`: the latest publication's work, summed over engines and per engine."""

    drained: int
    admitted_at_reopen: int
    engines: list[EngineCounts]


class PublicationController:
    """Drives the gates of a set of engines through a publication; any failure leaves all of them closed.

    Engine handles expose `seal()`, `drain(timeout_s)`, `install_version(version, **kw)`, `reopen()`,
    `reset(reason)` and `snapshot()`, sync, async or as Ray actor methods (and `stage_version(version, **kw)`
    where `stage` is used). A RequestGate is such a handle.
    """

    def __init__(self, engines: dict[str, Any] | None = None) -> None:
        self._engines: dict[str, Any] = dict(engines or {})
        self._frozen: tuple[str, ...] | None = None
        # Wall-clock (start, end) of each stage of the latest publication (seal, drain, install, reopen),
        # reset by prepare(): what the `version` event reports as its `phases` (trace export).
        self.timings: dict[str, tuple[float, float]] = {}
        # What each engine's drain() and reopen() returned in the latest publication (reset by prepare()).
        self._drained: dict[str, int] = {}
        self._admitted: dict[str, int] = {}

    @property
    def prepared(self) -> bool:
        return self._frozen is not None

    @property
    def engine_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._engines))

    def add_engine(self, engine_id: str, handle: Any) -> None:
        if engine_id in self._engines:
            raise ValueError(f"engine {engine_id!r} is already registered")
        self._engines[engine_id] = handle

    def remove_engine(self, engine_id: str) -> None:
        self._engines.pop(engine_id, None)

    async def prepare(self, timeout_s: float) -> None:
        """Freeze the engine set, seal every gate, then drain all of them under one monotonic deadline."""
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        deadline = time.monotonic() + timeout_s
        frozen = self.engine_ids
        if not frozen:
            raise PublicationError(None, "prepare", "no engine registered")
        self._frozen = frozen
        self.timings, self._drained, self._admitted = {}, {}, {}
        # Seal everything before draining anything: no engine admits new work while another drains.
        await self._timed("seal", self._on_all(frozen, "seal", deadline))
        drained = await self._timed("drain", self._on_all(frozen, "drain", deadline, remaining_arg=True))
        self._drained = _counts(drained)

    async def stage(self, version: int, timeout_s: float = 60.0, **stage_kwargs: Any) -> None:
        """Send every engine what installing `version` needs (its weights) before the gates close, so that the
        closed window holds only the swap. Gates are not touched; a failure raises PublicationError, and the
        caller then installs with the weights in full."""
        ids = self.engine_ids
        if not ids:
            raise PublicationError(None, "stage", "no engine registered")
        await self._on_all(ids, "stage_version", time.monotonic() + timeout_s, version, **stage_kwargs)

    async def publish(self, version: int, timeout_s: float = 60.0, **install_kwargs: Any) -> None:
        """Install `version` on every frozen engine, then reopen them all; nothing reopens unless all installed."""
        frozen = self._require_prepared("publish")
        deadline = time.monotonic() + timeout_s
        if self.engine_ids != frozen:
            raise PublicationError(
                None, "engine_set", f"engines changed since prepare: was {list(frozen)}, now {list(self.engine_ids)}"
            )
        await self._timed("install", self._on_all(frozen, "install_version", deadline, version, **install_kwargs))
        self._admitted = _counts(await self._timed("reopen", self._reopen_all(frozen, deadline)))
        self._frozen = None

    async def resume(self, timeout_s: float = 30.0) -> None:
        """Reopen after prepare() without a new version (e.g. a checkpoint taken after quiesce)."""
        frozen = self._require_prepared("resume")
        self._admitted = _counts(await self._timed("reopen", self._reopen_all(frozen, time.monotonic() + timeout_s)))
        self._frozen = None

    async def reset(self, reason: str, timeout_s: float = 30.0) -> None:
        """Clear poison on every engine (the owner resolved the unknown outcomes). Gates stay closed, sealed
        and not drained: prepare() and publish() or resume() next. Any frozen set is forgotten."""
        self._frozen = None
        await self._on_all(self.engine_ids, "reset", time.monotonic() + timeout_s, reason)

    def counts(self) -> PublicationCounts:
        """The latest publication's work (after publish() or resume()): per engine, the leases its drain waited
        for and the requests admitted at its reopen, and their sums. Engines whose handle returned no count
        (a handle predating the counts) are left out."""
        ids = sorted(set(self._drained) | set(self._admitted))
        engines = [
            EngineCounts(engine=e, drained=self._drained.get(e, 0), admitted_at_reopen=self._admitted.get(e, 0))
            for e in ids
        ]
        return PublicationCounts(
            drained=sum(e["drained"] for e in engines),
            admitted_at_reopen=sum(e["admitted_at_reopen"] for e in engines),
            engines=engines,
        )

    async def snapshot(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """The `gate` event data for all engines; an unreachable engine shows as poisoned with the error."""
        ids = self.engine_ids

        async def one(engine_id: str) -> dict[str, Any]:
            try:
                async with asyncio.timeout(timeout_s):
                    return dict(await call(self._engines[engine_id], "snapshot"))
            except Exception as exc:  # noqa: BLE001 - any failure is reported, not raised
                return {
                    "engine": engine_id,
                    "state": GateState.POISONED.value,
                    "version": None,
                    "active": 0,
                    "waiting": 0,
                    "error": f"unreachable: {exc!r}",
                }

        snaps = await asyncio.gather(*(one(e) for e in ids))
        for engine_id, snap in zip(ids, snaps):
            snap.setdefault("engine", engine_id)
        return gate_event_data(list(snaps))

    # --- internals ----------------------------------------------------------------------------------------
    async def _timed(self, stage: str, work: Any) -> Any:
        start = time.time()
        try:
            return await work
        finally:
            self.timings[stage] = (start, time.time())

    def _require_prepared(self, what: str) -> tuple[str, ...]:
        if self._frozen is None:
            raise PublicationError(None, what, "prepare() has not completed")
        return self._frozen

    async def _on_all(
        self, ids: tuple[str, ...], method: str, deadline: float, *args: Any, remaining_arg: bool = False, **kwargs: Any
    ) -> dict[str, Any]:
        """Call `method` on every engine at once; what each returned, by engine id (PublicationError if any failed)."""

        async def one(engine_id: str) -> Any:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("publication deadline passed")
            extra = (remaining,) if remaining_arg else ()
            # The engine's own drain deadline must fire first (it poisons); the grace only guards a hung call.
            async with asyncio.timeout(remaining + (_DRAIN_GRACE_S if remaining_arg else 0.0)):
                return await call(self._engines[engine_id], method, *extra, *args, **kwargs)

        results = await asyncio.gather(*(one(e) for e in ids), return_exceptions=True)
        failures = [(e, r) for e, r in zip(ids, results) if isinstance(r, BaseException)]
        if failures:
            engine, cause = failures[0]
            others = f" (+{len(failures) - 1} more: {[e for e, _ in failures[1:]]})" if len(failures) > 1 else ""
            raise PublicationError(engine, _stage(method), f"{cause!r}{others}") from cause
        return dict(zip(ids, results))

    async def _reopen_all(self, ids: tuple[str, ...], deadline: float) -> dict[str, Any]:
        try:
            return await self._on_all(ids, "reopen", deadline)
        except PublicationError:
            # Reopen is not atomic across engines: close the ones that did reopen again, then report.
            await asyncio.gather(*(call(self._engines[e], "seal") for e in ids), return_exceptions=True)
            raise


def _counts(results: dict[str, Any]) -> dict[str, int]:
    """The counts engines returned; anything but a non-negative int (a handle that returns nothing) is left out."""
    return {e: r for e, r in results.items() if isinstance(r, int) and not isinstance(r, bool) and r >= 0}


def _stage(method: str) -> str:
    return {"install_version": "install"}.get(method, method)
