"""Every exception the rollout package raises, under one base class so callers can catch them together."""

from __future__ import annotations

import asyncio
from typing import Any


class RolloutError(Exception):
    """Base class of every rollout error."""


# --- gate -------------------------------------------------------------------------------------------------
class GatePoisonedError(RolloutError):
    """The gate saw an unknown request outcome; it refuses everything until its owner calls reset()."""

    def __init__(self, engine: str, reason: str) -> None:
        super().__init__(f"gate {engine!r} is poisoned ({reason}); the owner must reset() it")
        self.engine = engine
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:  # crosses processes (raised by an engine actor)
        return (type(self), (self.engine, self.reason))


class GateStateError(RolloutError):
    """The operation is not allowed in the gate's current state; the message says what to do first."""


class StaleVersionError(GateStateError):
    """install_version() was given a version that is not newer than the installed one."""


class DrainTimeoutError(RolloutError, TimeoutError):
    """Leases were still active at the drain deadline; the gate has been poisoned."""


class AdmissionTimeoutError(RolloutError, TimeoutError):
    """A request waited for the gate to reopen longer than its own timeout (it never started)."""


class RejectedBeforeGeneration(RolloutError):
    """Raised inside a lease for a request refused before any token was generated: a safe failed attempt."""


# --- publication ------------------------------------------------------------------------------------------
class PublicationError(RolloutError):
    """A publication step failed on one engine; every gate was left closed."""

    def __init__(self, engine: str | None, stage: str, cause: BaseException | str) -> None:
        where = f"engine {engine!r}" if engine is not None else "engine set"
        super().__init__(f"publication failed at {stage} on {where}: {cause}")
        self.engine = engine
        self.stage = stage
        self.cause = cause


# --- router -----------------------------------------------------------------------------------------------
class SessionGoneError(RolloutError):
    """The session's KV cache is gone: its engine died, evicted it (memory bound) or aborted its request. It is
    never re-routed or replayed; the caller aborts the episode and runs it again as a new session."""

    def __init__(self, session_id: str, engine: str, reason: str) -> None:
        super().__init__(f"session {session_id!r} is gone: engine {engine!r} {reason}")
        self.session_id = session_id
        self.engine = engine
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:  # crosses processes (raised by an engine actor)
        return (type(self), (self.session_id, self.engine, self.reason))


class EpisodeAbortedError(RolloutError):
    """A rollout worker gave up an episode between turns (quiesce deadline, or a too long wait at a sealed gate);
    its group goes back to the sampler and is re-run as a new session."""

    def __init__(self, session_id: str, kind: str, reason: str) -> None:
        super().__init__(f"episode {session_id!r} aborted ({kind}): {reason}")
        self.session_id = session_id
        self.kind = kind
        self.reason = reason


class RouterFullError(RolloutError):
    """The router already holds its maximum number of live sessions."""


class NoEngineError(RolloutError):
    """No live engine is registered with the router."""


# --- scheduler --------------------------------------------------------------------------------------------
class SchedulerStateError(RolloutError):
    """The scheduler call is not allowed now; the message says why."""


class SchedulerClosedError(SchedulerStateError):
    """The scheduler was closed."""


class QuiesceTimeoutError(SchedulerStateError):
    """Groups were still in flight after quiesce's deadline and the grace given to the aborts it asked for."""


class NoWorkerLeftError(RolloutError):
    """Every rollout worker has been retired."""


class WorkerLostError(RolloutError):
    """A worker process is gone (what a Ray actor error maps to; fakes raise it directly)."""

    def __init__(self, worker: Any, cause: BaseException | str = "worker lost") -> None:
        super().__init__(f"rollout worker {worker} lost: {cause}")
        self.worker = worker
        self.cause = cause


# --- channel ----------------------------------------------------------------------------------------------
class ChannelError(RolloutError):
    """A channel misuse (unknown hook, bad weight, unknown consumer, closed channel)."""


class QueueFull(asyncio.QueueFull, RolloutError):
    """put_nowait on a full key."""


class QueueEmpty(asyncio.QueueEmpty, RolloutError):
    """get_nowait on an empty key."""
