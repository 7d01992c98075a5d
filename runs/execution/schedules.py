"""Cron schedules: create/update/delete them (validated), and submit the runs that are due (origin `schedule`).

A schedule fires at most once per tick however many cron times it missed (a platform that was down does not
replay a backlog); `next_run_at` is advanced and the run submitted in one transaction, so two ticks racing on
the same schedule submit one run.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from croniter import CroniterError, croniter
from django.db import transaction
from django.utils import timezone

from runs.audit.models import Action
from runs.audit.record import PLATFORM_ACTOR, Actor, actor_of, audit_record
from runs.errors import InvalidInput, ServiceError
from runs.execution import kinds
from runs.execution.submit import NAME_MAX, run_submit
from runs.models import Origin, Schedule

logger = logging.getLogger(__name__)

EDITABLE_FIELDS = ("name", "cron", "kind", "config", "enabled")
# A fired run is named "<schedule name> @ YYYY-MM-DD HH:MM" (UTC), so a schedule's name leaves room for that
# suffix within a run name's NAME_MAX: 200 - 19 = 181 characters.
FIRED_SUFFIX = " @ %Y-%m-%d %H:%M"
SCHEDULE_NAME_MAX = NAME_MAX - len(datetime(2000, 1, 1).strftime(FIRED_SUFFIX))


def fired_run_name(name: str, at: datetime) -> str:
    return f"{name}{at.strftime(FIRED_SUFFIX)}"


def cron_next(cron: str, *, after: datetime) -> datetime:
    return croniter(cron, after).get_next(datetime)


def cron_problem(cron: Any) -> str | None:
    """Why `cron` is not a usable schedule, or None: five fields (minute hour day month weekday, UTC; no seconds
    field, no @daily), accepted by croniter, and firing at least once (`0 0 31 2 *` never does)."""
    if not isinstance(cron, str) or len(cron.split()) != 5:
        return f"expected five space-separated fields (minute hour day month weekday), e.g. '0 3 * * *'; got {cron!r}"
    if not croniter.is_valid(cron):
        return f"not a valid cron expression: {cron!r} (e.g. '0 3 * * *')"
    try:
        cron_next(cron, after=timezone.now())
    except (CroniterError, ValueError, OverflowError):
        return f"{cron!r} never fires (no such date, e.g. 31 February)"
    return None


def _validated(fields: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(fields) - set(EDITABLE_FIELDS))
    if unknown:
        raise InvalidInput(f"unknown field(s) {unknown}; editable: {list(EDITABLE_FIELDS)}", field=unknown[0])
    if "name" in fields and (
        not isinstance(fields["name"], str) or not fields["name"].strip() or len(fields["name"]) > SCHEDULE_NAME_MAX
    ):
        raise InvalidInput(
            f"must be a non-empty string of at most {SCHEDULE_NAME_MAX} characters (its runs are named "
            f"'<name> @ YYYY-MM-DD HH:MM', at most {NAME_MAX})",
            field="name",
        )
    if "cron" in fields and (problem := cron_problem(fields["cron"])):
        raise InvalidInput(problem, field="cron")
    if "enabled" in fields and not isinstance(fields["enabled"], bool):
        raise InvalidInput("must be true or false", field="enabled")
    if "config" in fields and not isinstance(fields["config"], dict):
        raise InvalidInput("must be a JSON object", field="config")
    return fields


def schedule_check(*, owner: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """A whole schedule's fields, validated (cron, name, kind config) and authorized for `owner` (the kind's
    `authorize`, as a submit by that owner would be): the one check of the API (create) and the admin form.
    Returns the fields to store; raises InvalidInput naming the field."""
    fields = _validated(dict(fields))
    run_kind = kinds.kind_get(fields.get("kind", kinds.DEFAULT_KIND))
    fields["config"] = run_kind.validate_config(fields.get("config") or {})
    if run_kind.authorize is not None:
        run_kind.authorize(fields["config"], owner)
    return fields


def schedule_create(
    *,
    owner: Any,
    name: str,
    cron: str,
    kind: str = kinds.DEFAULT_KIND,
    config: dict[str, Any] | None = None,
    enabled: bool = True,
    actor: Actor | None = None,
) -> Schedule:
    fields = {"name": name, "cron": cron, "kind": kind, "config": config or {}, "enabled": enabled}
    fields = schedule_check(owner=owner, fields=fields)
    with transaction.atomic():
        schedule = Schedule.objects.create(owner=owner, next_run_at=cron_next(cron, after=timezone.now()), **fields)
        schedule_audited(actor or actor_of(owner), Action.SCHEDULE_CREATE, schedule, before=None)
    return schedule


def schedule_audited(actor: Actor, action: str, schedule: Schedule, *, before: dict[str, Any] | None) -> None:
    """The audit row of a schedule's change (the API's writes here, and the admin's: runs/admin.py)."""
    after = None if action == Action.SCHEDULE_DELETE else schedule_fields(schedule)
    audit_record(actor, action, target_type="schedule", target_id=schedule.pk, before=before, after=after)


def schedule_fields(schedule: Schedule) -> dict[str, Any]:
    return {"name": schedule.name, "cron": schedule.cron, "kind": schedule.kind, "enabled": schedule.enabled}


def schedule_update(*, schedule: Schedule, changes: dict[str, Any], actor: Actor) -> Schedule:
    fields = _validated(dict(changes))
    kind = kinds.kind_get(fields.get("kind", schedule.kind))
    if "config" in fields or "kind" in fields:
        fields["config"] = kind.validate_config(fields.get("config", schedule.config))
        if kind.authorize is not None:
            kind.authorize(fields["config"], schedule.owner)
    before = schedule_fields(schedule)
    for key, value in fields.items():
        setattr(schedule, key, value)
    if "cron" in fields or ("enabled" in fields and schedule.enabled):
        schedule.next_run_at = cron_next(schedule.cron, after=timezone.now())
    with transaction.atomic():
        schedule.save()
        schedule_audited(actor, Action.SCHEDULE_UPDATE, schedule, before=before)
    return schedule


def schedule_delete(*, schedule: Schedule, actor: Actor) -> None:
    with transaction.atomic():
        schedule_audited(actor, Action.SCHEDULE_DELETE, schedule, before=schedule_fields(schedule))
        schedule.delete()


def schedules_submit_due(*, now: datetime | None = None) -> list[int]:
    """Submit one run for each enabled schedule whose time has come; returns the submitted run ids."""
    now = now or timezone.now()
    submitted: list[int] = []
    due = Schedule.objects.filter(enabled=True, next_run_at__lte=now).values_list("pk", flat=True)
    for schedule_id in list(due):
        with transaction.atomic():
            schedule = (
                Schedule.objects.select_for_update().filter(pk=schedule_id, enabled=True, next_run_at__lte=now).first()
            )
            if schedule is None:
                continue  # another tick took it
            try:
                schedule.next_run_at = cron_next(schedule.cron, after=now)
            except (CroniterError, ValueError, OverflowError) as exc:  # stored before cron_problem existed
                logger.warning(
                    "schedule %s disabled: its cron %r never fires again (%s)", schedule.pk, schedule.cron, exc
                )
                schedule.enabled = False
                schedule.save(update_fields=["enabled"])
                continue
            try:
                run = run_submit(
                    owner=schedule.owner,
                    name=fired_run_name(schedule.name, now),
                    origin=Origin.SCHEDULE,
                    kind=schedule.kind,
                    config=schedule.config,
                    actor=PLATFORM_ACTOR,
                )
            except ServiceError as exc:  # e.g. a kind since removed: keep the schedule moving, say why
                logger.warning("schedule %s could not submit: %s", schedule.pk, exc)
                schedule.save(update_fields=["next_run_at"])
                continue
            schedule.last_run = run
            schedule.save(update_fields=["next_run_at", "last_run"])
            submitted.append(run.pk)
    return submitted
