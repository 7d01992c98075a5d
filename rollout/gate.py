"""RequestGate: per-engine admission of generation requests under leases, fail-closed weight installation.

Every request holds a lease; every lease ends with a settlement receipt. An unknown outcome poisons the gate,
and a poisoned gate refuses admission, drain, install and reopen until its owner resets it. Each publication's
work is counted: `drain()` returns the leases it waited for, `reopen()` the requests it admitted that had been
waiting at the closed gate.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from enum import Enum
from typing import Any

from rollout.errors import (
    AdmissionTimeoutError,
    DrainTimeoutError,
    GatePoisonedError,
    GateStateError,
    StaleVersionError,
)
from rollout.lease import Lease, LeaseContext, SettlementReceipt

__all__ = ["GateState", "Lease", "RequestGate", "SettlementReceipt", "gate_event_data"]


class GateState(str, Enum):
    OPEN = "open"
    SEALED = "sealed"
    DRAINING = "draining"
    INSTALLING = "installing"
    POISONED = "poisoned"


# Most severe first: the folded state of many engines is the worst one among them.
_SEVERITY = {
    GateState.POISONED: 4,
    GateState.INSTALLING: 3,
    GateState.DRAINING: 2,
    GateState.SEALED: 1,
    GateState.OPEN: 0,
}


class RequestGate:
    """Admission, drain and version installation for one inference engine (single asyncio event loop)."""

    def __init__(
        self, name: str = "engine", *, version: int = 0, initially_open: bool = True, max_failures_kept: int = 32
    ) -> None:
        if max_failures_kept < 1:
            raise ValueError("max_failures_kept must be at least 1")
        self.name = name
        self._state = GateState.OPEN if initially_open else GateState.SEALED
        self._version = version
        self._epoch = 0
        self._drained = False
        self._drain_waited: int | None = None  # leases in flight when this closed window's first drain began
        self._active: dict[str, Lease] = {}
        self._waiting = 0
        self._next_id = 0
        self._poison_reason: str | None = None
        self._failures = 0
        self._safe_failures = 0
        self._recent: deque[dict[str, Any]] = deque(maxlen=max_failures_kept)
        self._change: asyncio.Future[None] | None = None

    # --- properties ---------------------------------------------------------------------------------------
    @property
    def state(self) -> GateState:
        return self._state

    @property
    def version(self) -> int:
        return self._version

    @property
    def active(self) -> int:
        return len(self._active)

    # --- admission ----------------------------------------------------------------------------------------
    async def acquire(self, session_id: str, *, request_id: str | None = None, timeout: float | None = None) -> Lease:
        """Admit one request, waiting (up to `timeout` s) while the gate is closed for a publication."""
        if self._state is not GateState.OPEN:
            await self._wait_for_open(timeout)
        if request_id is None:
            self._next_id += 1
            request_id = f"{self.name}:{self._next_id}"
        elif request_id in self._active:
            raise GateStateError(f"request id {request_id!r} already holds a lease on gate {self.name!r}")
        lease = Lease(self, request_id, session_id, self._version, self._epoch)
        self._active[request_id] = lease
        return lease

    def lease(self, session_id: str, *, request_id: str | None = None, timeout: float | None = None) -> LeaseContext:
        """`async with gate.lease(sid) as lease:`; leaving the block settles the lease (see module doc)."""
        return LeaseContext(self, (session_id, request_id, timeout))

    async def _wait_for_open(self, timeout: float | None) -> None:
        self._waiting += 1
        try:
            async with asyncio.timeout(timeout):
                while self._state is not GateState.OPEN:
                    self._raise_if_poisoned()
                    await self._wait_change()
        except TimeoutError:
            if self._state is GateState.OPEN:
                return  # reopened before this waiter ran: admitted (reopen() counted it), not refused
            raise AdmissionTimeoutError(
                f"gate {self.name!r} stayed {self._state.value} for {timeout} s; request not admitted"
            ) from None
        finally:
            self._waiting -= 1

    def settle(self, lease: Lease, receipt: SettlementReceipt) -> SettlementReceipt:
        """End a lease. Idempotent: a second settle returns the first receipt. Unsafe receipts poison."""
        if lease.receipt is not None:
            return lease.receipt
        if lease._gate is not self:
            raise GateStateError(f"lease {lease.request_id!r} belongs to another gate")
        del self._active[lease.request_id]
        lease.receipt = receipt
        if not (receipt[3] and receipt[4]):  # backend_ended and outcome_recorded
            self._failures += 1
            self._recent.append(
                {
                    "request_id": receipt.request_id,
                    "session_id": receipt.session_id,
                    "outcome": receipt.outcome,
                    "detail": receipt.detail,
                    "ts": time.time(),
                }
            )
            self._poison(
                f"request {receipt.request_id!r} of session {receipt.session_id!r} ended "
                f"{receipt.outcome}: {receipt.detail or 'outcome unknown'}"
            )
        elif receipt.outcome == "rejected":
            self._safe_failures += 1
        if self._change is not None:
            self._notify()
        return receipt

    # --- publication steps --------------------------------------------------------------------------------
    def seal(self) -> None:
        """Stop admission; new requests wait for reopen(). Idempotent while closed."""
        self._raise_if_poisoned()
        if self._state is GateState.OPEN:
            self._state = GateState.SEALED
            self._drained = False
            self._drain_waited = None
            self._notify()

    async def drain(self, timeout_s: float) -> int:
        """Wait until no lease is active; at the deadline poison the gate and raise DrainTimeoutError.

        Returns how many leases the drain waited for: those in flight when the first drain of this closed window
        began. A repeated drain (after a cancel, a reset or a retried prepare) returns the same count: nothing is
        admitted while the gate is closed, so the leases it finds are some of those."""
        self._raise_if_poisoned()
        if self._state is GateState.OPEN:
            raise GateStateError(f"gate {self.name!r} is open: seal() before drain()")
        if self._state is GateState.INSTALLING:
            return self._drain_waited or 0  # drained before the install started
        self._state = GateState.DRAINING
        if self._drain_waited is None:
            self._drain_waited = len(self._active)
        waited = self._drain_waited
        self._notify()
        try:
            async with asyncio.timeout(timeout_s):
                while self._active:
                    await self._wait_change()
                    self._raise_if_poisoned()
                    if self._state is not GateState.DRAINING:
                        raise GateStateError(f"gate {self.name!r} left draining ({self._state.value}) mid-drain")
        except asyncio.CancelledError:
            if self._state is GateState.DRAINING:
                self._state = GateState.SEALED  # still closed; a later drain() starts over
                self._notify()
            raise
        except TimeoutError:
            ids = sorted(self._active)[:8]
            self._poison(f"drain deadline of {timeout_s} s passed with {len(self._active)} active lease(s) {ids}")
            raise DrainTimeoutError(f"gate {self.name!r}: {self._poison_reason}") from None
        self._raise_if_poisoned()
        if self._state is GateState.DRAINING:
            self._state = GateState.SEALED
            self._drained = True
            self._notify()
        return waited

    def install_version(self, version: int) -> bool:
        """Record `version` as installed (weights load while `installing`). Returns False for a repeated call."""
        self._raise_if_poisoned()
        if self._state is GateState.INSTALLING and version == self._version:
            return False
        if self._state is GateState.OPEN:
            raise GateStateError(f"gate {self.name!r} is open: seal() and drain() before install_version()")
        if self._state is GateState.INSTALLING:
            raise GateStateError(f"gate {self.name!r} is already installing version {self._version}: reopen() first")
        if not (self._state is GateState.SEALED and self._drained):
            raise GateStateError(f"gate {self.name!r} is {self._state.value} and not drained: drain() first")
        if not isinstance(version, int) or version <= self._version:
            raise StaleVersionError(
                f"gate {self.name!r}: version {version!r} is not newer than installed {self._version}"
            )
        self._version = version
        self._state = GateState.INSTALLING
        self._notify()
        return True

    def reopen(self) -> int:
        """Admit new requests (and every waiter) under the installed version. Returns how many requests were
        waiting at the closed gate: each is admitted now, under the new version (0 when already open)."""
        self._raise_if_poisoned()
        if self._state is GateState.OPEN:
            return 0
        if self._state is GateState.DRAINING:
            raise GateStateError(f"gate {self.name!r} is draining: wait for drain() before reopen()")
        self._state = GateState.OPEN
        self._drained = False
        self._drain_waited = None
        self._epoch += 1
        self._notify()
        return self._waiting

    def reset(self, reason: str = "reset by owner") -> str | None:
        """Clear poison (the owner resolved the unknown outcomes). The gate stays closed: sealed, not drained."""
        previous = self._poison_reason
        if self._state is GateState.POISONED:
            self._recent.append({"outcome": "reset", "detail": reason, "previous": previous, "ts": time.time()})
            self._poison_reason = None
            self._state = GateState.SEALED
            self._drained = False
            self._notify()
        return previous

    def snapshot(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "state": self._state.value,
            "version": self._version,
            "epoch": self._epoch,
            "active": len(self._active),
            "waiting": self._waiting,
            "drained": self._drained,
            "failures": self._failures,
            "safe_failures": self._safe_failures,
            "poison_reason": self._poison_reason,
            "recent_failures": list(self._recent),
        }

    # --- internals ----------------------------------------------------------------------------------------
    def _poison(self, reason: str) -> None:
        if self._state is not GateState.POISONED:
            self._poison_reason = reason
            self._state = GateState.POISONED
        self._notify()

    def _raise_if_poisoned(self) -> None:
        if self._state is GateState.POISONED:
            raise GatePoisonedError(self.name, self._poison_reason or "unknown")

    async def _wait_change(self) -> None:
        if self._change is None:
            self._change = asyncio.get_running_loop().create_future()
        # Shielded: one waiter's cancellation must not cancel the future every other waiter shares.
        await asyncio.shield(self._change)

    def _notify(self) -> None:
        change, self._change = self._change, None
        if change is not None and not change.done():
            change.set_result(None)

    def __repr__(self) -> str:
        return (
            f"RequestGate({self.name!r}, {self._state.value}, v{self._version}, active={len(self._active)}, "
            f"waiting={self._waiting})"
        )


def gate_event_data(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold engine snapshots into the `gate` event data: worst state, lowest version, summed counts."""
    if not snapshots:
        return {"state": GateState.SEALED.value, "version": None, "active": 0, "waiting": 0, "engines": []}
    state = max((GateState(s["state"]) for s in snapshots), key=_SEVERITY.__getitem__)
    versions = [s["version"] for s in snapshots if s.get("version") is not None]
    return {
        "state": state.value,
        "version": min(versions) if versions else None,
        "active": sum(s.get("active", 0) for s in snapshots),
        "waiting": sum(s.get("waiting", 0) for s in snapshots),
        "engines": snapshots,
    }
