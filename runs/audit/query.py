"""Reading the audit log: the filters of GET /api/audit/ and the staff page, validated (a bad value is an
InvalidInput naming the field, never a 500), and who last cancelled or resumed each run (the run JSON's
`cancelled_by` / `resumed_by`, derived from the rows rather than stored twice)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from django.db.models import QuerySet
from django.utils.dateparse import parse_datetime

from runs.audit.models import PLATFORM, Action, AuditEntry
from runs.errors import InvalidInput

FILTERS = ("actor", "action", "target", "since", "until")
TARGET_TYPES = ("run", "schedule", "settings", "token")
USERNAME = re.compile(r"[\w.@+-]{1,150}")
TARGET_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
DATETIME_MAX = 40


def audit_list(params: Mapping[str, str]) -> QuerySet[AuditEntry]:
    """Rows matching the filters `actor` (username, user id, or `platform`), `action` (one of Action), `target`
    (`<type>:<id>`, e.g. `run:12`), `since` and `until` (ISO 8601; no offset means UTC), newest first."""
    rows = AuditEntry.objects.all()
    actor = params.get("actor")
    if actor is not None:
        if actor.isascii() and actor.isdigit() and len(actor) <= 18:
            rows = rows.filter(actor_user_id=int(actor))
        elif actor == PLATFORM:
            rows = rows.filter(actor_user_id__isnull=True)
        elif USERNAME.fullmatch(actor):
            rows = rows.filter(actor_name=actor, actor_user_id__isnull=False)
        else:
            raise InvalidInput("must be a username, a user id or `platform`", field="actor")
    action = params.get("action")
    if action is not None:
        if action not in Action.values:
            raise InvalidInput(f"must be one of {', '.join(Action.values)}", field="action")
        rows = rows.filter(action=action)
    target = params.get("target")
    if target is not None:
        kind, _, target_id = target.partition(":")
        if kind not in TARGET_TYPES or not TARGET_ID.fullmatch(target_id):
            raise InvalidInput(f"must be <type>:<id> with a type of {', '.join(TARGET_TYPES)}", field="target")
        rows = rows.filter(target_type=kind, target_id=target_id)
    for name, lookup in (("since", "at__gte"), ("until", "at__lte")):
        if params.get(name) is not None:
            rows = rows.filter(**{lookup: _instant(params[name], name)})
    return rows.order_by("-at", "-id")


def _instant(raw: str, field: str) -> datetime:
    try:
        value = parse_datetime(raw) if len(raw) <= DATETIME_MAX else None
    except ValueError:  # well-formed but impossible, e.g. 2026-02-31
        value = None
    if value is None:
        raise InvalidInput("must be an ISO 8601 date and time, e.g. 2026-12-04T13:00:00Z", field=field)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def last_actors(run_ids: Iterable[int]) -> dict[int, dict[str, str | None]]:
    """{run id: {"cancelled_by": name or None, "resumed_by": name or None}}: the actors of each run's latest
    cancel and latest resume (`platform` for automatic ones), one query for all runs."""
    ids = [str(pk) for pk in run_ids]
    found: dict[int, dict[str, str | None]] = {int(pk): {"cancelled_by": None, "resumed_by": None} for pk in ids}
    rows = (
        AuditEntry.objects.filter(
            target_type="run", target_id__in=ids, action__in=[Action.RUN_CANCEL, Action.RUN_RESUME]
        )
        .order_by("-at", "-id")
        .values_list("target_id", "action", "actor_name")
    )
    for target_id, action, name in rows:
        key = "cancelled_by" if action == Action.RUN_CANCEL else "resumed_by"
        found[int(target_id)][key] = found[int(target_id)][key] or name
    return found


def audit_row_json(row: AuditEntry) -> dict[str, Any]:
    return {
        "id": row.pk,
        "at": row.at,
        "actor": row.actor_name,
        "actor_user_id": row.actor_user_id,
        "actor_token": row.actor_token or None,
        "action": row.action,
        "target": f"{row.target_type}:{row.target_id}",
        "request_id": row.request_id or None,
        "before": row.before,
        "after": row.after,
    }
