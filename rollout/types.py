"""Plain data passed between rollout workers, the scheduler and the trainer (picklable, no behaviour).

A GroupResult either carries its group (`payload`) or is a receipt for a group the worker put into a channel
(`payload` None): the scheduler's ledger works the same on both; a consumer of the channel then claims the
items it took (RolloutScheduler.claim)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GroupResult:
    """One generated group of G attempts for one prompt, as a worker returns it."""

    rewards: list[float]
    """One reward per attempt."""
    payload: Any = None
    """Whatever the trainer needs (tokens, behaviour log-probs, versions, request ids)."""
    valid: list[bool] | None = None
    """Per attempt: did it finish successfully (None: all valid)."""
    attempt_ids: Sequence[str | None] | None = None
    """Per attempt id (e.g. agent session id), used to count distinct attempts (None: all missing)."""
    aborted: bool = False
    """True when generation was interrupted: the group goes back to the data source, not to the trainer."""
    group_id: Any = None
    """The prompt group's id, for provenance and tests."""
    attempt: Any = None
    """Which attempt at the group this is (the worker's session id): tells a channel item of an earlier,
    abandoned attempt from the one this result stands for (RolloutScheduler.claim)."""
    filtered: str | None = None
    """The reason the worker's own filters dropped the group (None: kept, or not filtered by the worker)."""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutBatch:
    """What RolloutScheduler.generate returns: exactly batch_size kept groups plus drop accounting."""

    batch_id: Any
    groups: list[GroupResult]
    dropped: dict[str, int]
    """Groups dropped by a filter while this batch was collected, per reason."""
    dropped_ratio: float
    """dropped / (kept + dropped)."""
    aborted: int
    """Aborted groups returned to the data source while this batch was collected."""
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TurnCall:
    """One generation request for an engine, the arguments of `Engine.generate`: a rollout worker's turn or a
    session server's request. The calls one caller makes in one event-loop tick travel together in one
    `Engine.generate_many` call (rollout/coalesce.py)."""

    session_id: str
    new_tokens: list[list[int]]  # (G, T): this turn's new tokens, one list per row of the session
    n: int  # tokens to sample per row
    seed: int  # the request's sampling seed
    request_id: str  # its lease's id: every token it generates records it
    greedy: bool = False
    continues: bool = False  # a later turn: the engine must still hold the session's cache
    last: bool = False  # the episode's final turn: the engine ends the session with its answer
    stop: tuple[int, ...] = ()  # ids that finish a one-row request when sampled
    logit_bias: tuple[tuple[int, float], ...] = ()  # (id, bias) added to the logits / temperature before sampling
