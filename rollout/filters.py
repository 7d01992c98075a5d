"""Dynamic group filters: drop groups that carry no learning signal (zero variance, too few valid attempts)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from rollout.types import GroupResult


class FilterVerdict(NamedTuple):
    keep: bool
    reason: str | None = None


KEEP = FilterVerdict(True)


class GroupFilter(Protocol):
    def __call__(self, result: GroupResult) -> FilterVerdict: ...


class ZeroVarianceFilter:
    """Drops a group whose rewards are all equal within `eps` (group-relative advantages would all be zero).

    A group with one or no reward has zero variance by definition and is dropped too.
    """

    name = "zero_variance"

    def __init__(self, eps: float = 0.0) -> None:
        if eps < 0:
            raise ValueError("eps must be >= 0")
        self.eps = eps

    def __call__(self, result: GroupResult) -> FilterVerdict:
        rewards = result.rewards
        if len(rewards) < 2 or max(rewards) - min(rewards) <= self.eps:
            return FilterVerdict(False, self.name)
        return KEEP


class MinValidAttemptsFilter:
    """Keeps a group only when it has at least `min_valid` distinct valid attempts.

    Attempts are told apart by `attempt_ids`. A valid attempt WITHOUT an id counts as its own attempt: nothing
    shows it duplicates another, and lumping all missing ids into one would wrongly drop trainable groups.
    Valid attempts sharing an id count once (retries of the same agent session).
    """

    name = "min_valid_attempts"

    def __init__(self, min_valid: int) -> None:
        if min_valid < 1:
            raise ValueError("min_valid must be >= 1")
        self.min_valid = min_valid

    def __call__(self, result: GroupResult) -> FilterVerdict:
        n = len(result.rewards)
        valid = result.valid if result.valid is not None else [True] * n
        ids = result.attempt_ids if result.attempt_ids is not None else [None] * n
        if len(valid) != n or len(ids) != n:
            raise ValueError(f"group {result.group_id!r}: rewards, valid and attempt_ids differ in length")
        distinct: set[Any] = set()
        for position, (ok, attempt) in enumerate(zip(valid, ids)):
            if ok:
                distinct.add(("id", attempt) if attempt is not None else ("position", position))
        return KEEP if len(distinct) >= self.min_valid else FilterVerdict(False, self.name)


_REGISTRY: dict[str, Callable[..., GroupFilter]] = {
    ZeroVarianceFilter.name: ZeroVarianceFilter,
    MinValidAttemptsFilter.name: MinValidAttemptsFilter,
}


def load_filter(spec: str, **kwargs: Any) -> GroupFilter:
    """A filter by registered name (`zero_variance`, `min_valid_attempts`) or `module:Class`."""
    if spec in _REGISTRY:
        return _REGISTRY[spec](**kwargs)
    if ":" not in spec:
        raise ValueError(f"unknown filter {spec!r}: use one of {sorted(_REGISTRY)} or 'module:Class'")
    module, _, attr = spec.partition(":")
    factory: Callable[..., GroupFilter] = getattr(importlib.import_module(module), attr)
    return factory(**kwargs)


def apply_filters(filters: list[GroupFilter], result: GroupResult) -> FilterVerdict:
    """The first rejecting verdict, or KEEP."""
    for group_filter in filters:
        verdict = group_filter(result)
        if not verdict.keep:
            return FilterVerdict(False, verdict.reason or getattr(group_filter, "name", "filter"))
    return KEEP


def verdict_of(filters: list[GroupFilter], result: GroupResult) -> FilterVerdict:
    """The worker's own verdict when it filtered the group already (`result.filtered`), else the filters'."""
    return FilterVerdict(False, result.filtered) if result.filtered else apply_filters(filters, result)
