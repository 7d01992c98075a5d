"""Submit-time limits: which `origin` a request may claim, the run's time limit (staff-set default and maximum),
and the per-user caps on queued and active runs. The caps are counted under the grant lock (callers hold
`store.slots_lock()`), so concurrent submits by one user cannot pass a cap together. Rules: docs/slots.md.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count

from runs.errors import InvalidInput, LimitExceeded, NotAllowed
from runs.models import ACTIVE_STATUSES, Origin, Run, RunStatus
from runs.slots import store
from runs.slots.user_limits import UserLimits, limits_effective

PLATFORM_ORIGINS = (Origin.SCHEDULE, Origin.SYSTEM)


def limits_load() -> UserLimits:
    """Effective caps and time limits from the stored settings row (read fresh: callers hold the grant lock)."""
    return limits_effective(store.policy_stored_raw())


def origin_for_request(*, claimed: Any, via_session: bool, is_staff: bool) -> str:
    """The origin a submit request gets. It follows from how the request came in: a browser session gives
    `dashboard`, anything else (an API token) gives `api`. Staff may claim any origin (operations, tests). A
    non-staff user may repeat the origin they earn; claiming another one is a 403 naming `origin`."""
    earned = Origin.DASHBOARD if via_session else Origin.API
    if claimed is None:
        return earned
    if claimed not in Origin.values:
        raise InvalidInput(f"unknown origin {claimed!r}; expected one of {', '.join(Origin.values)}", field="origin")
    if is_staff or claimed == earned:
        return claimed
    if claimed in PLATFORM_ORIGINS:
        raise NotAllowed(
            f"origin {claimed!r} is set only by the platform (schedules, automatic evaluation runs); leave origin out",
            field="origin",
        )
    raise NotAllowed(
        f"origin {claimed!r} is not earned by this request: a browser session gets 'dashboard', an "
        f"API token gets 'api'; leave origin out or send {earned!r}",
        field="origin",
    )


def time_limit_resolve(requested: int | None, limits: UserLimits) -> int:
    """The run's time limit: the staff default when none is asked for; above the staff maximum is a 400."""
    if requested is None:
        return limits.default_time_limit_seconds
    if requested > limits.max_time_limit_seconds:
        raise InvalidInput(
            f"must be at most {limits.max_time_limit_seconds} seconds (the maximum set by staff, "
            f"max_time_limit_seconds); leave it out for the default of {limits.default_time_limit_seconds} s",
            field="time_limit_seconds",
        )
    return requested


def user_caps_check(*, owner: Any, limits: UserLimits) -> None:
    """Refuse one more queued run for `owner` when the owner already has `max_queued_per_user` queued runs or
    `max_running_per_user` active ones (429 naming the cap). The caller holds the grant lock."""
    rows = (
        Run.objects.filter(owner=owner, status__in=[RunStatus.QUEUED, *ACTIVE_STATUSES])
        .values("status")
        .annotate(n=Count("id"))
    )
    counts = {row["status"]: row["n"] for row in rows}
    queued = counts.get(RunStatus.QUEUED, 0)
    active = sum(counts.get(s, 0) for s in ACTIVE_STATUSES)
    if queued >= limits.max_queued_per_user:
        raise LimitExceeded(
            f"you have {queued} queued runs, the per-user limit (max_queued_per_user) is "
            f"{limits.max_queued_per_user}; wait for some to start or cancel one",
            field="max_queued_per_user",
        )
    if active >= limits.max_running_per_user:
        raise LimitExceeded(
            f"you have {active} active runs (starting, running or stopping), the per-user limit "
            f"(max_running_per_user) is {limits.max_running_per_user}; wait for one to finish or cancel one",
            field="max_running_per_user",
        )
