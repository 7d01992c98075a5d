"""Per-user caps and run time limits (checked at submit, not by the grant; runs/scheduling/limits.py): their
ranges and defaults, the effective values (`UserLimits`) and the cross-field rule on the time limits. Stored in the
concurrency settings blob and validated with the slot policy (runs/slots/policy.py). Pure: no Django imports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# key -> (low, high, default)
TIME_LIMIT_CEILING = 10**9
LIMIT_RULES: dict[str, tuple[int, int, int]] = {
    "max_queued_per_user": (1, 100_000, 20),
    "max_running_per_user": (1, 1000, 8),
    "default_time_limit_seconds": (1, TIME_LIMIT_CEILING, 24 * 3600),
    "max_time_limit_seconds": (1, TIME_LIMIT_CEILING, 7 * 24 * 3600),
}
LIMIT_KEYS = tuple(LIMIT_RULES)


@dataclass(frozen=True)
class UserLimits:
    """Effective per-user caps (queued runs; active = starting/running/stopping runs) and run time limits
    (a submit without `time_limit_seconds` gets the default; above the maximum is refused)."""

    max_queued_per_user: int
    max_running_per_user: int
    default_time_limit_seconds: int
    max_time_limit_seconds: int

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in LIMIT_KEYS}


def _in_range(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def limits_effective(raw: Any) -> UserLimits:
    """Stored settings -> effective caps and time limits; bad or missing values use defaults, and a default
    time limit above the maximum is lowered to it (every run gets a finite limit within the maximum)."""
    raw = raw if isinstance(raw, dict) else {}
    values = {
        k: raw[k] if _in_range(raw.get(k), low, high) else default for k, (low, high, default) in LIMIT_RULES.items()
    }
    values["default_time_limit_seconds"] = min(values["default_time_limit_seconds"], values["max_time_limit_seconds"])
    return UserLimits(**values)


def time_limits_check(raw: dict[str, Any], changes: dict[str, Any]) -> tuple[str, str] | None:
    """A stored default above the (stored or default) maximum is refused. An unset default follows the maximum
    down (limits_effective), so lowering only the maximum is always accepted."""
    if "default_time_limit_seconds" not in raw:
        return None
    default = raw["default_time_limit_seconds"]
    maximum = raw.get("max_time_limit_seconds", LIMIT_RULES["max_time_limit_seconds"][2])
    if default <= maximum:
        return None
    if changes.get("default_time_limit_seconds") is not None:
        return "default_time_limit_seconds", f"must not exceed max_time_limit_seconds ({maximum}), got {default}"
    return "max_time_limit_seconds", f"must be at least default_time_limit_seconds ({default}), got {maximum}"
