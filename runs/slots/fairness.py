"""Fair share and bounded waiting: the staff settings that change the order of waiting runs (issue 26, items 2-4),
their validation, and the pure arithmetic the grant uses (decayed usage, dominant share, effective priority).

Every option is off or neutral by default, so an unchanged settings blob decides exactly as the seed did (class
priority, then FIFO). Per class: `fair_share` (order the class's waiting runs by their owner's decayed usage,
FIFO among one owner's runs), `max_running_per_user` (held runs of one owner in the class; past it a run stays
queued with `user_limit_reached`), `aging_per_hour` and `aging_cap` (priority points a waiting run gains per hour
of wait, up to the cap), `max_wait_seconds` (a run that waited longer goes before every run that has not, whatever
its class priority, when its class rules allow). Top level: `fair_share_half_life_seconds` (> 0) and
`user_weights` (user id -> shares; usage is divided by them).

Usage is computed outside the grant (runs/slots/usage.py) and passed in; the decay is a pure function of the
times given to it. Pure: no Django imports.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeGuard, TypeVar

from runs.slots.resources import Res

T = TypeVar("T")
HALF_LIFE_DEFAULT = 3600
HALF_LIFE_MIN, HALF_LIFE_MAX = 1, 10**8
WEIGHT_MIN, WEIGHT_MAX = 1, 1000
WEIGHTS_MAX_ENTRIES = 1000
AGING_MAX = 100  # priority points (per hour, and the cap): the whole priority range
WAIT_MIN, WAIT_MAX = 1, 10**9
USER_LIMIT_MIN, USER_LIMIT_MAX = 1, 1000
FAIR_TOP_KEYS = ("fair_share_half_life_seconds", "user_weights")
FAIR_CLASS_KEYS = ("fair_share", "max_running_per_user", "aging_per_hour", "aging_cap", "max_wait_seconds")
# DRF's dominant share, with GPU-seconds weighted above CPU-seconds and memory (Django's
# SLOTS_FAIR_SHARE_RESOURCE_WEIGHTS overrides these).
RESOURCE_WEIGHTS_DEFAULT: dict[str, float] = {"GPU": 4.0, "CPU": 1.0, "memory": 1.0}


@dataclass(frozen=True)
class ClassFairness:
    fair_share: bool = False
    max_running_per_user: int | None = None
    aging_per_hour: int = 0
    aging_cap: int = 0
    max_wait_seconds: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in FAIR_CLASS_KEYS}

    @property
    def per_owner(self) -> bool:
        """The class's order is not FIFO across owners: loaders fetch each owner's FIFO prefix (`owner_prefix`)."""
        return self.fair_share or self.max_running_per_user is not None


@dataclass(frozen=True)
class Fairness:
    half_life_seconds: int = HALF_LIFE_DEFAULT
    user_weights: Mapping[int, int] = field(default_factory=dict)
    classes: Mapping[str, ClassFairness] = field(default_factory=dict)

    def of(self, run_class: str) -> ClassFairness:
        return self.classes.get(run_class) or NEUTRAL

    def weight(self, owner: int) -> int:
        return self.user_weights.get(owner, 1)


NEUTRAL = ClassFairness()


def _int_in(value: Any, low: int, high: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def fairness_effective(raw: Any, classes: Iterable[str]) -> Fairness:
    """Stored (possibly damaged) settings -> effective fairness; a bad value counts as its neutral default."""
    raw = raw if isinstance(raw, dict) else {}
    half = raw.get("fair_share_half_life_seconds")
    weights = raw.get("user_weights")
    stored: dict[str, Any] = raw.get("classes") if isinstance(raw.get("classes"), dict) else {}
    out: dict[str, ClassFairness] = {}
    for name in classes:
        item = stored.get(name)
        item = item if isinstance(item, dict) else {}
        limit, wait = item.get("max_running_per_user"), item.get("max_wait_seconds")
        rate, cap = item.get("aging_per_hour"), item.get("aging_cap")
        out[name] = ClassFairness(
            fair_share=item.get("fair_share") is True,
            max_running_per_user=limit if _int_in(limit, USER_LIMIT_MIN, USER_LIMIT_MAX) else None,
            aging_per_hour=rate if _int_in(rate, 0, AGING_MAX) else 0,
            aging_cap=cap if _int_in(cap, 0, AGING_MAX) else 0,
            max_wait_seconds=wait if _int_in(wait, WAIT_MIN, WAIT_MAX) else None,
        )
    return Fairness(
        half_life_seconds=half if _int_in(half, HALF_LIFE_MIN, HALF_LIFE_MAX) else HALF_LIFE_DEFAULT,
        user_weights={
            int(k): v
            for k, v in (weights.items() if isinstance(weights, dict) else ())
            if isinstance(k, str) and k.isdigit() and _int_in(v, WEIGHT_MIN, WEIGHT_MAX)
        },
        classes={k: v for k, v in out.items() if v != NEUTRAL},  # only what differs: defaults compare equal
    )


def fairness_check(key: str, value: Any) -> str | None:
    """Why a submitted fairness value is bad (None: fine). `key` is the setting's own name."""
    if key == "fair_share":
        return None if isinstance(value, bool) else f"must be true or false, got {type(value).__name__}"
    if key == "user_weights":
        return _weights_problem(value)
    ranges = {
        "fair_share_half_life_seconds": (HALF_LIFE_MIN, HALF_LIFE_MAX),
        "max_running_per_user": (USER_LIMIT_MIN, USER_LIMIT_MAX),
        "aging_per_hour": (0, AGING_MAX),
        "aging_cap": (0, AGING_MAX),
        "max_wait_seconds": (WAIT_MIN, WAIT_MAX),
    }
    low, high = ranges[key]
    if not _int_in(value, low, high):
        return f"must be an integer from {low} to {high}, got {value!r}"[:200]
    return None


def _weights_problem(value: Any) -> str | None:
    if not isinstance(value, dict):
        return "must be an object mapping user ids to weights"
    if len(value) > WEIGHTS_MAX_ENTRIES:
        return f"at most {WEIGHTS_MAX_ENTRIES} users, got {len(value)}"
    for k, v in value.items():
        if not (isinstance(k, str) and k.isdigit() and len(k) <= 12):
            return f"keys must be user ids (digits), got {k[:40]!r}"
        if not _int_in(v, WEIGHT_MIN, WEIGHT_MAX):
            return f"weight of user {k} must be an integer from {WEIGHT_MIN} to {WEIGHT_MAX}, got {v!r}"[:200]
    return None


# Usage: resource-seconds decayed with a half-life, then DRF's dominant share over the cluster's capacity.


def decayed_seconds(start: datetime, end: datetime | None, now: datetime, half_life: float) -> float:
    """Seconds of running in [start, end] (end None: still running, up to now), each second weighted by
    2^-(age/half_life): the integral of the decay over the interval. Pure: the times are given."""
    stop = now if end is None or end > now else end
    if stop <= start:
        return 0.0
    k = math.log(2) / half_life
    return (math.exp(-k * (now - stop).total_seconds()) - math.exp(-k * (now - start).total_seconds())) / k


def dominant_shares(
    spans: Iterable[tuple[int, datetime, datetime | None, Res]],
    *,
    now: datetime,
    fairness: Fairness,
    capacity: Res,
    resource_weights: Mapping[str, float],
) -> dict[int, float]:
    """Per owner: the largest over resources of weight x decayed resource-seconds / cluster capacity, divided
    by the owner's weight. `spans`: (owner, start, end or None, the run's granted resources)."""
    used: dict[int, list[float]] = {}
    for owner, start, end, res in spans:
        seconds = decayed_seconds(start, end, now, fairness.half_life_seconds)
        if seconds > 0:
            acc = used.setdefault(owner, [0.0, 0.0, 0.0])
            for i, amount in enumerate(res.values()):
                acc[i] += amount * seconds
    caps = dict(zip(("CPU", "GPU", "memory"), capacity.values()))
    out: dict[int, float] = {}
    for owner, acc in used.items():
        shares = [
            resource_weights.get(name, 1.0) * value / caps[name]
            for name, value in zip(("CPU", "GPU", "memory"), acc)
            if caps[name] > 0
        ]
        out[owner] = max(shares, default=0.0) / fairness.weight(owner)
    return out


def owner_prefix(rows: Iterable[T], size: int, owner_of: Callable[[T], int]) -> list[T]:
    """Of FIFO-ordered rows, each owner's first `size`: every run a pass could take or pass over when the class
    is ordered per owner (a pass takes at most `size` runs of the class, each the next of its owner)."""
    seen: dict[int, int] = {}
    out = []
    for row in rows:
        owner = owner_of(row)
        seen[owner] = seen.get(owner, 0) + 1
        if seen[owner] <= size:
            out.append(row)
    return out


def effective_priority(priority: int, rules: ClassFairness, waited_seconds: float) -> float:
    """Class priority plus aging: `aging_per_hour` points per hour waited, at most `aging_cap` points."""
    if rules.aging_per_hour <= 0 or rules.aging_cap <= 0 or waited_seconds <= 0:
        return float(priority)
    return priority + min(float(rules.aging_cap), rules.aging_per_hour * waited_seconds / 3600.0)


def overdue(rules: ClassFairness, waited_seconds: float) -> bool:
    """Waited longer than the class's `max_wait_seconds` (None: never)."""
    return rules.max_wait_seconds is not None and waited_seconds > rules.max_wait_seconds
