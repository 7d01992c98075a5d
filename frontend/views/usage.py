"""The settings page's usage table (issue 26): CPU- and GPU-hours held per user and per team (a Django group) over
the last day and week, and each user's fair-share usage as the grant sees it. Staff only, like its page."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model

from runs.slots.fairness import Fairness
from runs.slots.store import capacity_load
from runs.slots.usage import hours_by_owner, usage_load

WINDOWS = (("day", 86_400), ("week", 7 * 86_400))
ROWS_MAX = 50  # the heaviest users and teams; how many more there are is said below the table


def _row(name: str, owners: list[int], hours: dict[str, dict[int, tuple[float, float]]]) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name}
    for window, _ in WINDOWS:
        row[f"cpu_{window}"] = round(sum(hours[window].get(o, (0.0, 0.0))[0] for o in owners), 2)
        row[f"gpu_{window}"] = round(sum(hours[window].get(o, (0.0, 0.0))[1] for o in owners), 2)
    return row


def _heaviest(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    rows.sort(key=lambda r: (-r["gpu_week"], -r["cpu_week"], r["name"]))
    return rows[:ROWS_MAX], max(0, len(rows) - ROWS_MAX)


def usage_context(now: datetime, fairness: Fairness) -> dict[str, Any]:
    hours = hours_by_owner(now=now, windows=dict(WINDOWS))
    owners = set().union(*hours.values())
    names = dict(get_user_model().objects.filter(pk__in=owners).values_list("pk", "username"))
    shares = usage_load(fairness, capacity_load(), now=now) if owners else {}
    users = [_row(names.get(o, f"user {o}"), [o], hours) | {"fair_usage": shares.get(o)} for o in owners]
    members: dict[str, list[int]] = {}
    through = get_user_model().groups.through
    for group, user in through.objects.filter(user_id__in=owners).values_list("group__name", "user_id"):
        members.setdefault(group, []).append(user)
    teams = [_row(group, ids, hours) for group, ids in members.items()]
    user_rows, users_left = _heaviest(users)
    team_rows, teams_left = _heaviest(teams)
    fair_on = bool(shares)
    return {
        "fair_on": fair_on,
        "tables": [
            {"key": "users", "label": "User", "rows": user_rows, "left": users_left, "fair": fair_on},
            {"key": "teams", "label": "Team", "rows": team_rows, "left": teams_left, "fair": False},
        ],
    }
