"""PublicationController: one weight publication across many engines (seal, drain, install, reopen), fail-closed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rollout.errors import PublicationError
from rollout.gate import GateState, gate_event_data
from rollout.invoke import call

_DRAIN_GRACE_S = 2.0


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
        self.timings = {}
        # Seal everything before draining anything: no engine admits new work while another drains.
        await self._timed("seal", self._on_all(frozen, "seal", deadline))
        await self._timed("drain", self._on_all(frozen, "drain", deadline, remaining_arg=True))

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
        await self._timed("reopen", self._reopen_all(frozen, deadline))
        self._frozen = None

    async def resume(self, timeout_s: float = 30.0) -> None:
        """Reopen after prepare() without a new version (e.g. a checkpoint taken after quiesce)."""
        frozen = self._require_prepared("resume")
        await self._timed("reopen", self._reopen_all(frozen, time.monotonic() + timeout_s))
        self._frozen = None

    async def reset(self, reason: str, timeout_s: float = 30.0) -> None:
        """Clear poison on every engine (the owner resolved the unknown outcomes). Gates stay closed, sealed
        and not drained: prepare() and publish() or resume() next. Any frozen set is forgotten."""
        self._frozen = None
        await self._on_all(self.engine_ids, "reset", time.monotonic() + timeout_s, reason)

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
    async def _timed(self, stage: str, work: Any) -> None:
        start = time.time()
        try:
            await work
        finally:
            self.timings[stage] = (start, time.time())

    def _require_prepared(self, what: str) -> tuple[str, ...]:
        if self._frozen is None:
            raise PublicationError(None, what, "prepare() has not completed")
        return self._frozen

    async def _on_all(
        self, ids: tuple[str, ...], method: str, deadline: float, *args: Any, remaining_arg: bool = False, **kwargs: Any
    ) -> None:
        async def one(engine_id: str) -> None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("publication deadline passed")
            extra = (remaining,) if remaining_arg else ()
            # The engine's own drain deadline must fire first (it poisons); the grace only guards a hung call.
            async with asyncio.timeout(remaining + (_DRAIN_GRACE_S if remaining_arg else 0.0)):
                await call(self._engines[engine_id], method, *extra, *args, **kwargs)

        results = await asyncio.gather(*(one(e) for e in ids), return_exceptions=True)
        failures = [(e, r) for e, r in zip(ids, results) if isinstance(r, BaseException)]
        if failures:
            engine, cause = failures[0]
            others = f" (+{len(failures) - 1} more: {[e for e, _ in failures[1:]]})" if len(failures) > 1 else ""
            raise PublicationError(engine, _stage(method), f"{cause!r}{others}") from cause

    async def _reopen_all(self, ids: tuple[str, ...], deadline: float) -> None:
        try:
            await self._on_all(ids, "reopen", deadline)
        except PublicationError:
            # Reopen is not atomic across engines: close the ones that did reopen again, then report.
            await asyncio.gather(*(call(self._engines[e], "seal") for e in ids), return_exceptions=True)
            raise


def _stage(method: str) -> str:
    return {"install_version": "install"}.get(method, method)
