"""Preemption settings (issue 26 item 1): which classes' runs may be preempted and which classes' waiting runs may
preempt them, the grace a victim gets to checkpoint and stop, and the per-run daily cap; their validation and the
effective values. Off by default: no class preempts, so an unchanged settings blob decides exactly as before.

Per class: `preemptible` (its held runs may be chosen as victims) and `preempts` (its waiting runs may preempt
preemptible runs of strictly lower class priority). Top level: `preempt_grace_seconds` (how long a victim has to
checkpoint and stop before it is stopped hard) and `max_preemptions_per_run_per_day` (a run preempted that often
in the last 24 hours is never chosen again until the oldest of them is a day old). Pure: no Django imports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GRACE_DEFAULT, GRACE_MIN, GRACE_MAX = 120, 1, 3600
CAP_DEFAULT, CAP_MIN, CAP_MAX = 3, 0, 1000
PREEMPT_TOP_KEYS = ("preempt_grace_seconds", "max_preemptions_per_run_per_day")
PREEMPT_CLASS_KEYS = ("preemptible", "preempts")


@dataclass(frozen=True)
class ClassPreemption:
    preemptible: bool = False
    preempts: bool = False


@dataclass(frozen=True)
class Preemption:
    grace_seconds: int = GRACE_DEFAULT
    max_per_run_per_day: int = CAP_DEFAULT
    classes: Mapping[str, ClassPreemption] = field(default_factory=dict)

    def of(self, run_class: str) -> ClassPreemption:
        return self.classes.get(run_class) or OFF

    @property
    def on(self) -> bool:
        """Some class preempts and some class may be preempted: otherwise no preemption can ever happen."""
        rules = self.classes.values()
        return any(c.preempts for c in rules) and any(c.preemptible for c in rules)

    def to_dict(self) -> dict[str, Any]:
        return {
            "preempt_grace_seconds": self.grace_seconds,
            "max_preemptions_per_run_per_day": self.max_per_run_per_day,
        }


OFF = ClassPreemption()


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def preemption_effective(raw: Any, classes: Iterable[str]) -> Preemption:
    """Stored (possibly damaged) settings -> effective preemption rules; a bad value counts as its default (off)."""
    raw = raw if isinstance(raw, dict) else {}
    grace, cap = raw.get("preempt_grace_seconds"), raw.get("max_preemptions_per_run_per_day")
    stored: dict[str, Any] = raw.get("classes") if isinstance(raw.get("classes"), dict) else {}
    out: dict[str, ClassPreemption] = {}
    for name in classes:
        item = stored.get(name)
        item = item if isinstance(item, dict) else {}
        rules = ClassPreemption(preemptible=item.get("preemptible") is True, preempts=item.get("preempts") is True)
        if rules != OFF:
            out[name] = rules
    return Preemption(
        grace_seconds=grace if _int_in(grace, GRACE_MIN, GRACE_MAX) else GRACE_DEFAULT,
        max_per_run_per_day=cap if _int_in(cap, CAP_MIN, CAP_MAX) else CAP_DEFAULT,
        classes=out,
    )


def preemption_check(key: str, value: Any) -> str | None:
    """Why a submitted preemption value is bad (None: fine). `key` is the setting's own name."""
    if key in PREEMPT_CLASS_KEYS:
        return None if isinstance(value, bool) else f"must be true or false, got {type(value).__name__}"
    low, high = {
        "preempt_grace_seconds": (GRACE_MIN, GRACE_MAX),
        "max_preemptions_per_run_per_day": (CAP_MIN, CAP_MAX),
    }[key]
    if not _int_in(value, low, high):
        return f"must be an integer from {low} to {high}, got {value!r}"[:200]
    return None
