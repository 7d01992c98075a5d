"""Writes of the concurrency settings (the slot policy and per-user limits): validate, store, grant under
the new limits in the same transaction."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import transaction

from runs.audit.models import Action
from runs.audit.record import Actor, actor_of, audit_record
from runs.core.lifecycle import grant_pass
from runs.core.publish import dashboard_publish
from runs.errors import InvalidInput
from runs.models import ConcurrencySettings
from runs.slots import store
from runs.slots.policy import PolicyError, policy_check_merged, policy_merge, policy_validate


def settings_update(*, changes: Any, partial: bool, by: Any, actor: Actor | None = None) -> dict[str, Any]:
    """Validate and store concurrency settings (partial merges, full replaces), then grant under new limits.
    Returns the new stored raw settings. Raises InvalidInput naming the field. Audited (before/after: the stored
    settings) as `actor`, default `by`."""
    try:
        policy_validate(changes)
    except PolicyError as exc:
        raise InvalidInput(exc.message, field=exc.field) from exc
    _groups_exist(changes)
    with transaction.atomic():
        store.slots_lock()
        row = ConcurrencySettings.objects.select_for_update().order_by("pk").first()
        old = row.raw if row else {}
        raw = policy_merge(old, changes, partial=partial)
        try:
            policy_check_merged(raw, default_max_total=settings.SLOTS_DEFAULT_MAX_TOTAL, changes=changes)
        except PolicyError as exc:
            raise InvalidInput(exc.message, field=exc.field) from exc
        if row is None:
            row = ConcurrencySettings(raw=raw, updated_by=by if getattr(by, "pk", None) else None)
        else:
            row.raw, row.updated_by = raw, (by if getattr(by, "pk", None) else None)
        row.save()
        before = {"raw": old}
        audit_record(
            actor or actor_of(by),
            Action.SETTINGS_CONCURRENCY,
            target_type="settings",
            target_id="concurrency",
            before=before,
            after={"raw": raw},
        )
        store.policy_forget()
        dashboard_publish({"kind": "settings"})
        grant_pass(reason="settings")
    store.policy_forget()
    return raw


def _groups_exist(changes: dict[str, Any]) -> None:
    """Every team named in a submitted `team_quotas` is an existing Django group (400 naming the field)."""
    for name, item in (changes.get("classes") or {}).items():
        teams = item.get("team_quotas") or {}
        missing = sorted(set(teams) - set(Group.objects.filter(name__in=list(teams)).values_list("name", flat=True)))
        if missing:
            shown = ", ".join(repr(m[:40]) for m in missing[:3])
            raise InvalidInput(f"no such group: {shown}", field=f"classes.{name}.team_quotas")
