"""Team quotas (issue 26, Kueue cohorts): a Django group's nominal share of a class's slots, with borrowing when
no team with unused quota waits. The settings, their validation, and the pure rule the grant applies.

Per class, off by default: `team_quotas` ({group name: nominal slots}; the sum at most the class limit) and
`team_borrowing_limit` (slots a team may hold above its quota; absent: no bound, 0: no borrowing). A run's team
in a class is the first by name of its owner's groups that has a quota there; an owner in none belongs to the
implicit remainder team (`UNASSIGNED`), whose quota is the class limit minus the sum. In a class with quotas the
runs of teams below their quota are taken first (in the class's own order: FIFO or fair share), then the runs of
teams that may borrow; a run of a team at its quota plus its borrowing limit stays queued (`team_quota_reached`).
A borrowed slot is never preempted: it is given back when its run ends, and the next free slot of the class
goes to a team below its quota first. Pure: no Django imports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar


class Owned(Protocol):
    @property
    def owner(self) -> int: ...


class HeldOwned(Owned, Protocol):
    @property
    def run_class(self) -> str: ...


W = TypeVar("W", bound=Owned)

QUOTA_CLASS_KEYS = ("team_quotas", "team_borrowing_limit")
UNASSIGNED = ""  # the implicit team of owners in no group with a quota in the class
QUOTA_MIN, QUOTA_MAX = 0, 1000
BORROW_MIN, BORROW_MAX = 0, 1000
TEAMS_MAX = 100  # teams with a quota per class
NAME_MAX = 150  # Django's Group.name max_length
WITHIN, BORROWING, BLOCKED = 0, 1, 2  # a team's standing for its next run: under quota, borrowing, held back


@dataclass(frozen=True)
class ClassQuotas:
    quotas: Mapping[str, int] = field(default_factory=dict)  # team (group name) -> nominal slots
    borrowing_limit: int | None = None  # slots a team may hold above its quota (None: no bound, 0: none)

    def nominal(self, team: str, limit: int) -> int:
        """A team's quota; the implicit remainder team's is what the named teams leave of the class limit."""
        return self.quotas.get(team, 0) if team != UNASSIGNED else max(0, limit - sum(self.quotas.values()))

    def team_of(self, groups: Sequence[str]) -> str:
        """The team a run of an owner in these groups (sorted by name) counts against in this class."""
        return next((g for g in groups if g in self.quotas), UNASSIGNED)


@dataclass(frozen=True)
class TeamQuotas:
    classes: Mapping[str, ClassQuotas] = field(default_factory=dict)  # only the classes with quotas

    def of(self, run_class: str) -> ClassQuotas | None:
        return self.classes.get(run_class)

    @property
    def names(self) -> tuple[str, ...]:
        """Every group with a quota in some class, sorted: the groups loaders read memberships of."""
        return tuple(sorted({name for c in self.classes.values() for name in c.quotas}))


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def quotas_effective(raw: Any, classes: Iterable[str]) -> TeamQuotas:
    """Stored (possibly damaged) settings -> the classes' quotas; a bad entry is left out, a class without any
    valid entry has no quotas."""
    found = raw.get("classes") if isinstance(raw, dict) else None
    stored: dict[str, Any] = found if isinstance(found, dict) else {}
    out: dict[str, ClassQuotas] = {}
    for name in classes:
        item: dict[str, Any] = stored[name] if isinstance(stored.get(name), dict) else {}
        teams = item.get("team_quotas")
        valid = {
            k: v
            for k, v in (teams.items() if isinstance(teams, dict) else ())
            if isinstance(k, str) and 0 < len(k) <= NAME_MAX and _int_in(v, QUOTA_MIN, QUOTA_MAX)
        }
        borrow = item.get("team_borrowing_limit")
        if valid:
            out[name] = ClassQuotas(dict(sorted(valid.items())), borrow if _int_in(borrow, 0, BORROW_MAX) else None)
    return TeamQuotas(out)


def quota_check(key: str, value: Any) -> str | None:
    """Why a submitted quota value is bad (None: fine). `key` is the setting's own name."""
    if key == "team_borrowing_limit":
        ok = _int_in(value, BORROW_MIN, BORROW_MAX)
        return None if ok else f"must be an integer from {BORROW_MIN} to {BORROW_MAX}, got {value!r}"[:200]
    if not isinstance(value, dict):
        return "must be an object mapping group names to slots"
    if len(value) > TEAMS_MAX:
        return f"at most {TEAMS_MAX} teams, got {len(value)}"
    for k, v in value.items():
        if not (isinstance(k, str) and k.strip() and len(k) <= NAME_MAX):
            return f"team names must be group names of 1 to {NAME_MAX} characters, got {str(k)[:40]!r}"
        if not _int_in(v, QUOTA_MIN, QUOTA_MAX):
            return f"quota of {k[:40]!r} must be an integer from {QUOTA_MIN} to {QUOTA_MAX}, got {v!r}"[:200]
    return None


def quota_check_merged(quotas: TeamQuotas, limits: Mapping[str, int]) -> tuple[str, str] | None:
    """(field, message) when a class's quotas add up to more than its (effective) limit; else None."""
    for name, item in quotas.classes.items():
        limit, total = limits[name], sum(item.quotas.values())
        if total > limit:
            return f"classes.{name}.team_quotas", f"the quotas add up to {total}, more than the class limit {limit}"
    return None


class TeamLedger:
    """Held runs per (class, team) through one grant pass: the standing of each team's next run (under quota,
    borrowing, held back) and the class's waiting runs rearranged accordingly."""

    def __init__(
        self,
        quotas: TeamQuotas,
        limits: Mapping[str, int],
        running: Iterable[HeldOwned],
        groups: Mapping[int, Sequence[str]],
    ) -> None:
        self.quotas, self.limits, self.groups = quotas, limits, groups
        self.held: dict[tuple[str, str], int] = {}
        for h in running:
            self.take(h.run_class, h.owner)

    def copy(self) -> TeamLedger:
        out = TeamLedger(self.quotas, self.limits, (), self.groups)
        out.held = dict(self.held)
        return out

    def team(self, run_class: str, owner: int) -> str | None:
        """The owner's team in the class (None: the class has no quotas)."""
        quotas = self.quotas.of(run_class)
        return None if quotas is None else quotas.team_of(self.groups.get(owner, ()))

    def standing(self, run_class: str, owner: int) -> int:
        quotas, team = self.quotas.of(run_class), self.team(run_class, owner)
        if quotas is None or team is None:
            return WITHIN
        held = self.held.get((run_class, team), 0)
        nominal = quotas.nominal(team, self.limits[run_class])
        if held < nominal:
            return WITHIN
        borrow = quotas.borrowing_limit
        return BORROWING if borrow is None or held < nominal + borrow else BLOCKED

    def take(self, run_class: str, owner: int) -> None:
        team = self.team(run_class, owner)
        if team is not None:
            self.held[(run_class, team)] = self.held.get((run_class, team), 0) + 1

    def release(self, run_class: str, owner: int) -> None:
        team = self.team(run_class, owner)
        if team is not None:
            self.held[(run_class, team)] -= 1

    def arrange(self, run_class: str, rest: list[W]) -> tuple[list[W], int]:
        """The class's runs not yet taken, runs of teams under quota first, then those of teams that may borrow
        (each part in the class's order), and how many were left out: their team may take no more now."""
        if self.quotas.of(run_class) is None:
            return rest, 0
        parts: tuple[list[W], ...] = ([], [], [])
        for w in rest:
            parts[self.standing(run_class, w.owner)].append(w)
        return parts[WITHIN] + parts[BORROWING], len(parts[BLOCKED])

    def factor(self, run_class: str, owner: int) -> dict[str, Any]:
        """The team factor of GET /api/runs/<id>/priority/ and the detail of `team_quota_reached`."""
        quotas, team = self.quotas.of(run_class), self.team(run_class, owner)
        if quotas is None or team is None:
            return {"enabled": False, "team": None, "quota": None, "held": 0, "borrowing_limit": None, "state": None}
        state = ("within_quota", "borrowing", "quota_reached")[self.standing(run_class, owner)]
        return {
            "enabled": True,
            "team": team or None,  # null: the implicit remainder team of owners in no group with a quota
            "quota": quotas.nominal(team, self.limits[run_class]),
            "held": self.held.get((run_class, team), 0),
            "borrowing_limit": quotas.borrowing_limit,
            "state": state,
        }
