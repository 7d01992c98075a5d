"""Leases and settlement receipts: how one admitted generation request is tracked and how it ended."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from rollout.errors import RejectedBeforeGeneration

if TYPE_CHECKING:
    from rollout.gate import RequestGate


class SettlementReceipt(NamedTuple):
    """How one lease ended. Safe only when the backend is known to have stopped and the outcome is recorded."""

    request_id: str
    session_id: str
    version: int
    backend_ended: bool
    outcome_recorded: bool
    outcome: str  # completed | rejected | cancelled | timeout | lost | error | record_failed
    detail: str = ""

    @property
    def safe(self) -> bool:
        return self.backend_ended and self.outcome_recorded

    @classmethod
    def completed(cls, lease: Lease, detail: str = "") -> SettlementReceipt:
        return cls(lease.request_id, lease.session_id, lease.version, True, True, "completed", detail)

    @classmethod
    def rejected(cls, lease: Lease, detail: str) -> SettlementReceipt:
        """Refused before any token was generated (e.g. prompt longer than the context): safe."""
        return cls(lease.request_id, lease.session_id, lease.version, True, True, "rejected", detail)

    @classmethod
    def unknown(cls, lease: Lease, outcome: str, detail: str = "") -> SettlementReceipt:
        """The backend may still be working or the result was not recorded: poisons the gate."""
        return cls(lease.request_id, lease.session_id, lease.version, False, False, outcome, detail)


_new_receipt = tuple.__new__  # skips NamedTuple's keyword handling on the hot path


class Lease:
    """One admitted request: tag every token it produces with `version` and `request_id`."""

    __slots__ = ("request_id", "session_id", "version", "epoch", "started_at", "receipt", "_gate")

    def __init__(self, gate: RequestGate, request_id: str, session_id: str, version: int, epoch: int) -> None:
        self._gate = gate
        self.request_id = request_id
        self.session_id = session_id
        self.version = version
        self.epoch = epoch
        self.started_at = time.monotonic()
        self.receipt: SettlementReceipt | None = None

    @property
    def settled(self) -> bool:
        return self.receipt is not None

    def settle(self, receipt: SettlementReceipt) -> SettlementReceipt:
        return self._gate.settle(self, receipt)

    def __repr__(self) -> str:
        return f"Lease({self.request_id!r}, session={self.session_id!r}, v{self.version}, settled={self.settled})"


class LeaseContext:
    """`async with gate.lease(...)`: builds the receipt from how the block ended (class, not a generator: cheap)."""

    __slots__ = ("_gate", "_args", "_lease")

    def __init__(self, gate: RequestGate, args: tuple[str, str | None, float | None]) -> None:
        self._gate = gate
        self._args = args
        self._lease: Lease | None = None

    async def __aenter__(self) -> Lease:
        session_id, request_id, timeout = self._args
        self._lease = await self._gate.acquire(session_id, request_id=request_id, timeout=timeout)
        return self._lease

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        lease = self._lease
        if lease is None or lease.receipt is not None:
            return None
        if exc_type is None:
            receipt = _new_receipt(
                SettlementReceipt, (lease.request_id, lease.session_id, lease.version, True, True, "completed", "")
            )
        elif issubclass(exc_type, RejectedBeforeGeneration):
            receipt = SettlementReceipt.rejected(lease, str(exc))
        elif issubclass(exc_type, asyncio.CancelledError):
            receipt = SettlementReceipt.unknown(lease, "cancelled", "cancelled mid-flight")
        elif issubclass(exc_type, TimeoutError):
            receipt = SettlementReceipt.unknown(lease, "timeout", repr(exc))
        else:
            # The backend may still be generating: fail closed.
            receipt = SettlementReceipt.unknown(lease, "error", repr(exc))
        self._gate.settle(lease, receipt)
        return None
