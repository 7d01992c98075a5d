"""Who may see a run: its owner, or staff. The one rule behind every reader of runs (the REST API, the policy
proxy, both websockets and the board); a run someone may not see is reported as not found, never as forbidden
to them, so its existence is not revealed."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from runs.models import Run


def may_see(user: Any, owner_id: int | None) -> bool:
    """Whether `user` may see a run owned by `owner_id`."""
    return bool(getattr(user, "is_staff", False) or (owner_id is not None and owner_id == getattr(user, "pk", None)))


def visible_runs(user: Any, runs: QuerySet[Run] | None = None) -> QuerySet[Run]:
    """`runs` (default: all) narrowed to those `user` may see."""
    runs = Run.objects.all() if runs is None else runs
    return runs if getattr(user, "is_staff", False) else runs.filter(owner_id=getattr(user, "pk", None))
