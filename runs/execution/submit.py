"""Submitting a run: validate it against its kind and the owner's limits, create it `queued` with a waiting
slot, and grant, in one transaction (runs.scheduling.enqueue.run_enqueue)."""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs.audit.models import Action
from runs.audit.record import Actor, actor_of, audit_record
from runs.errors import InvalidInput
from runs.execution.kinds import RunKind, kind_get
from runs.models import ORIGIN_TO_CLASS, Origin, Run, RunStatus
from runs.scheduling import limits
from runs.scheduling.enqueue import run_enqueue
from runs.slots import store
from runs.slots.columns import demand_of
from runs.slots.fit import never_fits
from runs.slots.resources import Res
from runs.slots.user_limits import TIME_LIMIT_CEILING

NAME_MAX = 200
TIME_LIMIT_MAX = TIME_LIMIT_CEILING


def run_submit(
    *,
    owner: Any,
    name: str,
    origin: str,
    kind: str,
    config: Any,
    time_limit_seconds: int | None = None,
    parent: Run | None = None,
    auto_resume: bool = False,
    user_caps: bool = True,
    actor: Actor | None = None,
) -> Run:
    """Validate, create the run with a waiting slot, and grant in the same transaction. `auto_resume`: when the
    run fails, the platform resumes it from its last checkpoint (at most RUN_AUTO_RESUME_MAX times).
    `origin` is trusted here (the API derives it: runs.scheduling.limits.origin_for_request). Every run gets a finite
    time limit (the staff default when none is given; above the staff maximum is a 400). `user_caps`: refuse with
    LimitExceeded (429) when the owner is at a per-user cap; only automatic evaluation runs pass False. `actor`: who
    submits, for the audit row (default: the owner; the platform for scheduled and follow-up runs)."""
    if origin not in Origin.values:
        raise InvalidInput(f"unknown origin {origin!r}; expected one of {', '.join(Origin.values)}", field="origin")
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX:
        raise InvalidInput(f"must be a non-empty string of at most {NAME_MAX} characters", field="name")
    if time_limit_seconds is not None and (
        not isinstance(time_limit_seconds, int)
        or isinstance(time_limit_seconds, bool)
        or not 1 <= time_limit_seconds <= TIME_LIMIT_MAX
    ):
        raise InvalidInput(
            f"must be an integer number of seconds from 1 to {TIME_LIMIT_MAX}", field="time_limit_seconds"
        )
    if not isinstance(auto_resume, bool):
        raise InvalidInput("must be true or false", field="auto_resume")
    run_kind, config, resources = run_demand(kind=kind, config=config, owner=owner)
    with transaction.atomic():
        store.slots_lock()
        resources_check(resources, store.capacity_load())
        user_limits = limits.limits_load()
        time_limit_seconds = limits.time_limit_resolve(time_limit_seconds, user_limits)
        if user_caps:
            limits.user_caps_check(owner=owner, limits=user_limits)
        run = Run.objects.create(
            name=name.strip(),
            origin=origin,
            run_class=ORIGIN_TO_CLASS[origin],
            kind=run_kind.name,
            config=config,
            owner=owner,
            time_limit_seconds=time_limit_seconds,
            resources=resources,
            parent=parent,
            status=RunStatus.QUEUED,
            auto_resume=auto_resume,
        )
        run_enqueue(run=run, now=timezone.now())
        after = {"status": run.status, "name": run.name, "origin": origin, "kind": run.kind}
        audit_record(actor or actor_of(owner), Action.RUN_SUBMIT, target_type="run", target_id=run.pk, after=after)
    run.refresh_from_db()
    return run


def resources_check(resources: dict[str, Any], capacity: dict[str, Res]) -> None:
    """400 (field `config`) when the demand could not fit even the whole alive cluster; unknown capacity
    (no node rows yet) accepts: the run waits until the tick has read the cluster."""
    problem = never_fits(demand_of(resources.get("bundles")), resources.get("strategy") or "PACK", capacity)
    if problem is not None:
        raise InvalidInput(f"this run can never start: it {problem}", field="config")


def run_demand(*, kind: Any, config: Any, owner: Any) -> tuple[RunKind, dict[str, Any], dict[str, Any]]:
    """Validate a kind and config like a submit; return the kind, the config to store and its demand JSON."""
    run_kind = kind_get(kind)
    if not isinstance(config, dict):
        raise InvalidInput("must be a JSON object", field="config")
    if "\\u0000" in json.dumps(config):
        raise InvalidInput("must not contain NUL characters", field="config")
    config = run_kind.validate_config(config)
    if run_kind.authorize is not None:
        run_kind.authorize(config, owner)
    return run_kind, config, run_kind.demand(config)


def run_resources(*, kind: Any, config: Any, owner: Any) -> dict[str, Any]:
    """What a run of this kind and config would ask the cluster for (POST /api/runs/resources/), and whether
    it could ever fit the alive cluster (`fits`; `problem`: why not, the text a submit's 400 would carry)."""
    _kind, _config, resources = run_demand(kind=kind, config=config, owner=owner)
    problem = never_fits(
        demand_of(resources.get("bundles")), resources.get("strategy") or "PACK", store.capacity_load()
    )
    return {
        "bundles": resources.get("bundles", []),
        "total": resources.get("total", {}),
        "strategy": resources.get("strategy", "PACK"),
        "fits": problem is None,
        "problem": problem,
    }
