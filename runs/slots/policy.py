"""Concurrency policy: validation of stored/submitted settings and the effective slot policy the grant uses
(`Policy`). The per-user caps and run time limits applied at submit (runs/slots/user_limits.py) live in the same
stored settings blob (`ConcurrencySettings.raw`) and are validated here with the rest.

Pure: no Django imports, so grant tests and the settings form share one definition of every rule.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

from runs.slots.fairness import (
    FAIR_CLASS_KEYS,
    FAIR_TOP_KEYS,
    Fairness,
    fairness_check,
    fairness_effective,
)
from runs.slots.preempt_policy import (
    PREEMPT_CLASS_KEYS,
    PREEMPT_TOP_KEYS,
    Preemption,
    preemption_check,
    preemption_effective,
)
from runs.slots.quota import QUOTA_CLASS_KEYS, TeamQuotas, quota_check, quota_check_merged, quotas_effective
from runs.slots.user_limits import LIMIT_KEYS, LIMIT_RULES, time_limits_check

if TYPE_CHECKING:
    from runs.messages import SlotPolicy

CLASSES: tuple[str, ...] = ("interactive", "app", "schedule", "system")
DEFAULT_PRIORITY: dict[str, int] = {"interactive": 40, "app": 30, "schedule": 20, "system": 10}
LIMIT_MIN, LIMIT_MAX = 1, 1000
RESERVE_MIN, RESERVE_MAX = 0, 1000
PRIORITY_MIN, PRIORITY_MAX = 0, 100
TOP_KEYS = ("max_total", "interactive_reserve", "classes", *LIMIT_KEYS, *FAIR_TOP_KEYS, *PREEMPT_TOP_KEYS)
CLASS_KEYS = ("limit", "priority", "gpu_limit", *FAIR_CLASS_KEYS, *PREEMPT_CLASS_KEYS, *QUOTA_CLASS_KEYS)
# The options checked by their own modules (fair share and bounded waiting, preemption, team quotas): key -> why a
# value is bad.
OPTION_CHECKS = {
    **{k: functools.partial(fairness_check, k) for k in (*FAIR_TOP_KEYS, *FAIR_CLASS_KEYS)},
    **{k: functools.partial(preemption_check, k) for k in (*PREEMPT_TOP_KEYS, *PREEMPT_CLASS_KEYS)},
    **{k: functools.partial(quota_check, k) for k in QUOTA_CLASS_KEYS},
}
GPU_LIMIT_MIN, GPU_LIMIT_MAX = 0, 1000


class PolicyError(ValueError):
    """Invalid concurrency settings; `field` is the dotted name of the offending field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class ClassPolicy:
    limit: int
    priority: int
    gpu_limit: int | None = None  # GPUs the class may hold at once (None: no limit)


@dataclass(frozen=True)
class Policy:
    """Effective concurrency settings; `interactive_reserve` is already clamped to 0..max_total-1."""

    max_total: int
    interactive_reserve: int
    classes: dict[str, ClassPolicy] = field(default_factory=dict)
    fairness: Fairness = field(default_factory=Fairness)  # fair share and bounded waiting (all off by default)
    preemption: Preemption = field(default_factory=Preemption)  # which classes preempt which (off by default)
    quotas: TeamQuotas = field(default_factory=TeamQuotas)  # team quotas per class (none by default)

    @property
    def borrowable(self) -> int:
        """Slots the non-interactive classes may use together: everything except the interactive reserve."""
        return max(0, self.max_total - self.interactive_reserve)

    @property
    def limits(self) -> dict[str, int]:
        return {k: c.limit for k, c in self.classes.items()}

    def per_owner(self, run_class: str) -> bool:
        """The class's order is not FIFO across owners (fair share, a per-user limit, team quotas): loaders fetch
        each owner's FIFO prefix (`owner_prefix`) instead of the class's FIFO heads."""
        return self.fairness.of(run_class).per_owner or self.quotas.of(run_class) is not None

    def to_dict(self) -> SlotPolicy:
        return {
            "max_total": self.max_total,
            "interactive_reserve": self.interactive_reserve,
            "classes": {
                k: {"limit": c.limit, "priority": c.priority, "gpu_limit": c.gpu_limit} for k, c in self.classes.items()
            },
        }


def is_int(value: Any) -> TypeGuard[int]:
    # bool is a subclass of int in Python; a JSON `true` must not pass for 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _in_range(value: Any, low: int, high: int) -> TypeGuard[int]:
    return is_int(value) and low <= value <= high


def reserve_effective(max_total: int, reserve: int | None) -> int:
    """Unset means max(1, max_total // 4); always clamped to 0..max_total-1 so other classes can run."""
    wanted = max(1, max_total // 4) if reserve is None else reserve
    return max(0, min(wanted, max_total - 1))


def policy_defaults(max_total: int, reserve: int | None = None) -> Policy:
    """Defaults for a total: interactive may use every slot, the others everything but the reserve."""
    kept = reserve_effective(max_total, reserve)
    others = max(1, max_total - kept)
    return Policy(
        max_total=max_total,
        interactive_reserve=kept,
        classes={
            k: ClassPolicy(limit=max_total if k == "interactive" else others, priority=DEFAULT_PRIORITY[k])
            for k in CLASSES
        },
    )


def policy_effective(raw: Any, *, default_max_total: int, default_reserve: int | None = None) -> Policy:
    """Stored (possibly partial or damaged) settings -> effective policy; bad or missing values use defaults
    (`default_reserve`: the reserve when none is stored; None: max(1, max_total // 4))."""
    raw = raw if isinstance(raw, dict) else {}
    total = raw.get("max_total")
    total = total if _in_range(total, LIMIT_MIN, LIMIT_MAX) else max(LIMIT_MIN, min(default_max_total, LIMIT_MAX))
    reserve = raw.get("interactive_reserve")
    reserve = reserve if _in_range(reserve, RESERVE_MIN, RESERVE_MAX) else default_reserve
    base = policy_defaults(total, reserve)
    stored_classes = raw.get("classes")
    if not isinstance(stored_classes, dict):
        stored_classes = {}
    classes: dict[str, ClassPolicy] = {}
    for name in CLASSES:
        item = stored_classes.get(name)
        if not isinstance(item, dict):
            item = {}
        limit = item.get("limit")
        priority = item.get("priority")
        gpu_limit = item.get("gpu_limit")
        classes[name] = ClassPolicy(
            limit=limit if _in_range(limit, LIMIT_MIN, LIMIT_MAX) else base.classes[name].limit,
            priority=priority if _in_range(priority, PRIORITY_MIN, PRIORITY_MAX) else base.classes[name].priority,
            gpu_limit=gpu_limit if _in_range(gpu_limit, GPU_LIMIT_MIN, GPU_LIMIT_MAX) else None,
        )
    return Policy(
        max_total=base.max_total,
        interactive_reserve=base.interactive_reserve,
        classes=classes,
        fairness=fairness_effective(raw, CLASSES),
        preemption=preemption_effective(raw, CLASSES),
        quotas=quotas_effective(raw, CLASSES),
    )


def _check_int(field_name: str, value: Any, low: int, high: int) -> None:
    if not is_int(value):
        raise PolicyError(field_name, f"must be an integer from {low} to {high}, got {type(value).__name__}")
    if not low <= value <= high:
        raise PolicyError(field_name, f"must be from {low} to {high}, got {value}")


def policy_validate(changes: Any) -> None:
    """Check submitted settings (only the keys given); raise PolicyError naming the first bad field."""
    if not isinstance(changes, dict):
        raise PolicyError("settings", "must be a JSON object")
    for key in changes:
        if key not in TOP_KEYS:
            raise PolicyError(str(key), f"unknown setting; expected one of {', '.join(TOP_KEYS)}")
    if "max_total" in changes:
        _check_int("max_total", changes["max_total"], LIMIT_MIN, LIMIT_MAX)
    if "interactive_reserve" in changes and changes["interactive_reserve"] is not None:
        _check_int("interactive_reserve", changes["interactive_reserve"], RESERVE_MIN, RESERVE_MAX)
    for key, (low, high, _default) in LIMIT_RULES.items():
        if changes.get(key) is not None:  # null resets to the default
            _check_int(key, changes[key], low, high)
    for key in (*FAIR_TOP_KEYS, *PREEMPT_TOP_KEYS):
        if changes.get(key) is not None and (problem := OPTION_CHECKS[key](changes[key])):
            raise PolicyError(key, problem)
    classes = changes.get("classes", {})
    if not isinstance(classes, dict):
        raise PolicyError("classes", "must be an object keyed by class name")
    for name, item in classes.items():
        if name not in CLASSES:
            raise PolicyError(f"classes.{name}", f"unknown class; expected one of {', '.join(CLASSES)}")
        if not isinstance(item, dict):
            raise PolicyError(f"classes.{name}", f"must be an object with some of {', '.join(CLASS_KEYS)}")
        for key in item:
            if key not in CLASS_KEYS:
                raise PolicyError(f"classes.{name}.{key}", f"unknown field; expected one of {', '.join(CLASS_KEYS)}")
            if key in OPTION_CHECKS and item[key] is not None:  # null: off (no limit)
                if problem := OPTION_CHECKS[key](item[key]):
                    raise PolicyError(f"classes.{name}.{key}", problem)
        if "limit" in item:
            _check_int(f"classes.{name}.limit", item["limit"], LIMIT_MIN, LIMIT_MAX)
        if "priority" in item:
            _check_int(f"classes.{name}.priority", item["priority"], PRIORITY_MIN, PRIORITY_MAX)
        if item.get("gpu_limit") is not None:  # null: no GPU limit
            _check_int(f"classes.{name}.gpu_limit", item["gpu_limit"], GPU_LIMIT_MIN, GPU_LIMIT_MAX)


def policy_merge(stored: Any, changes: dict[str, Any], *, partial: bool) -> dict[str, Any]:
    """New raw settings: a partial update keeps stored values it does not mention, a full one replaces them.

    Only explicitly given values are stored, so unset class limits keep following max_total and the reserve.
    """
    base = stored if (partial and isinstance(stored, dict)) else {}
    scalars = ("max_total", "interactive_reserve", *LIMIT_KEYS, *FAIR_TOP_KEYS, *PREEMPT_TOP_KEYS)
    out: dict[str, Any] = {k: base[k] for k in scalars if k in base}
    for key in scalars:
        if key in changes:
            if changes[key] is None:
                out.pop(key, None)  # null resets to the default
            else:
                out[key] = changes[key]
    stored_classes = base.get("classes")
    if not isinstance(stored_classes, dict):
        stored_classes = {}
    classes = {k: dict(v) for k, v in stored_classes.items() if k in CLASSES and isinstance(v, dict)}
    for name, item in changes.get("classes", {}).items():
        merged = classes.setdefault(name, {})
        merged.update(item)
        for key in ("gpu_limit", *FAIR_CLASS_KEYS, *PREEMPT_CLASS_KEYS, *QUOTA_CLASS_KEYS):
            if key in merged and merged[key] is None:
                del merged[key]  # null: no GPU limit, the option off
    out["classes"] = classes
    return out


def policy_check_merged(raw: dict[str, Any], *, default_max_total: int, changes: dict[str, Any]) -> None:
    """Cross-field rules: an explicitly set reserve must stay below max_total (when max_total > 1); the default
    time limit may not exceed the maximum (the field named is the one being changed); a class's team quotas may
    not add up to more than its limit."""
    if problem := time_limits_check(raw, changes):
        raise PolicyError(*problem)
    effective = policy_effective(raw, default_max_total=default_max_total)
    if problem := quota_check_merged(effective.quotas, effective.limits):
        raise PolicyError(*problem)
    if "interactive_reserve" not in changes or changes["interactive_reserve"] is None:
        return
    total = raw.get("max_total", default_max_total)
    reserve = raw["interactive_reserve"]
    if total > 1 and reserve >= total:
        raise PolicyError(
            "interactive_reserve",
            f"must be below max_total ({total}); a reserve of {reserve} would leave no slot for the other classes",
        )
