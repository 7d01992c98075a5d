"""Queue visibility: each queued run's position (grant order), why it waits (`pending_reason` and detail) and an
ETA; and the dry-run (would a run of this origin and demand be granted now?). Re-exported by runs.selectors.

Reasons, checked in this order: the team's quota (`team_quota_reached`: its team may borrow no more, or holds its
quota while the class is full), the class rules (`class_limit_reached`, `reserve_protected`,
`global_limit_reached`), the class's per-user limit (`user_limit_reached`), `gpu_limit_reached`, then
`insufficient_resources` (the run's bundles do not fit the nodes' free resources now; detail: what it needs and
what is free), else `higher_priority_waiting`. Positions are grant order: the seed's (class priority, FIFO) by
index counts or one scan; with a fairness option on, the whole queue ranked (runs/scheduling/priority.py).

ETA: the queued run at overall position p starts when the p-th slot frees, the held runs freeing theirs at
their predicted finishes (runs/scheduling/finishes.py, runs/scheduling/progress.py: queue_starts); with no finish known,
the position over the recent grant rate; for `insufficient_resources`, no earlier than the run would fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from runs.errors import InvalidInput
from runs.models import ORIGIN_TO_CLASS, Origin, Run, RunStatus, Slot, SlotState
from runs.scheduling.finishes import active_finishes, typical_run_seconds
from runs.scheduling.preemption import would_preempt
from runs.scheduling.priority import positions_ranked
from runs.scheduling.progress import queue_starts
from runs.slots import columns, store
from runs.slots.fairness import Fairness
from runs.slots.fit import fit_detail, shadow_time
from runs.slots.grant import (
    CLASS_LIMIT_REACHED,
    GPU_LIMIT_REACHED,
    HIGHER_PRIORITY_WAITING,
    INSUFFICIENT_RESOURCES,
    TEAM_QUOTA_REACHED,
    USER_LIMIT_REACHED,
    Snapshot,
    WaitingSlot,
    blocking_reason,
    gpu_blocked,
    plan,
    user_blocked,
)
from runs.slots.policy import CLASSES, Policy
from runs.slots.quota import TeamLedger
from runs.slots.resources import Res, pack
from runs.slots.teams import with_groups

# ETA: grant rate over the most recent grants within this window.
ETA_WINDOW = timedelta(minutes=30)
ETA_SAMPLE = 50
# Above this many queued runs in one call, one scan of the queue beats per-run counts.
SCAN_THRESHOLD = 8


@dataclass(frozen=True)
class QueueInfo:
    position_in_class: int
    position_overall: int
    pending_reason: str
    eta_seconds: float | None
    pending_detail: dict[str, Any] | None = None


def grant_rate_per_second(*, now: datetime) -> float | None:
    """Recent grants per second (None with fewer than two grants lately: one grant tells no rate, and the
    quotient of one grant over the time since would predict a wait as long as the time already waited)."""
    recent = list(
        Run.objects.filter(granted_at__gte=now - ETA_WINDOW)
        .order_by("-granted_at")
        .values_list("granted_at", flat=True)[:ETA_SAMPLE]
    )
    if len(recent) < 2:
        return None
    oldest = recent[-1]
    assert oldest is not None  # granted_at__gte excludes null
    span = max((now - oldest).total_seconds(), 1.0)
    return len(recent) / span


def _positions_by_count(policy: Policy, queued: list[Run]) -> dict[int, tuple[int, int]]:
    """(in class, overall) positions of a few runs: index-backed counts of the waiting runs ahead of each."""
    slots = {s.run_id: s for s in Slot.objects.filter(run_id__in=[r.pk for r in queued], state=SlotState.WAITING)}
    waiting = Slot.objects.filter(state=SlotState.WAITING)
    out: dict[int, tuple[int, int]] = {}
    for run in queued:
        slot = slots.get(run.pk)
        if slot is None:
            continue
        ahead = Q(requested_at__lt=slot.requested_at) | Q(requested_at=slot.requested_at, run_id__lt=slot.run_id)
        in_class = waiting.filter(ahead, run_class=run.run_class).count()
        mine = policy.classes[run.run_class].priority
        higher = [k for k in CLASSES if policy.classes[k].priority > mine]
        same = [k for k in CLASSES if k != run.run_class and policy.classes[k].priority == mine]
        overall = in_class
        if higher:
            overall += waiting.filter(run_class__in=higher).count()
        if same:
            overall += waiting.filter(ahead, run_class__in=same).count()
        out[run.pk] = (in_class + 1, overall + 1)
    return out


def _positions_by_scan(policy: Policy, queued: list[Run]) -> dict[int, tuple[int, int]]:
    """Positions of many runs at once: one scan of the waiting slots, ranked in grant order."""
    wanted = {r.pk for r in queued}
    rows = Slot.objects.filter(state=SlotState.WAITING).values_list("run_id", "run_class", "requested_at")
    ranked = sorted(rows, key=lambda r: (-policy.classes[r[1]].priority, r[2], r[0]))
    seen_in_class = {k: 0 for k in CLASSES}
    out: dict[int, tuple[int, int]] = {}
    for index, (run_id, run_class, _at) in enumerate(ranked):
        seen_in_class[run_class] += 1
        if run_id in wanted:
            out[run_id] = (seen_in_class[run_class], index + 1)
    return out


def _demand(resources: Any) -> tuple[tuple[Res, ...], str]:
    resources = resources if isinstance(resources, dict) else {}
    return columns.demand_of(resources.get("bundles")), resources.get("strategy") or "PACK"


def wait_reason(
    snapshot: Snapshot,
    run_class: str,
    demand: tuple[Res, ...],
    strategy: str,
    *,
    held: dict[str, int] | None = None,
    owner: int | None = None,
    taken: Sequence[tuple[str, int]] = (),
) -> tuple[str, dict[str, Any] | None]:
    """Why a run of this class and demand (and owner) waits on this snapshot: its team's quota, the class rules,
    then the class's per-user limit, then resources. `taken`: (class, owner) of runs a pass would grant first."""
    policy = snapshot.policy
    reason = blocking_reason(policy, held if held is not None else snapshot.held, run_class)
    if owner is not None and policy.quotas.of(run_class) is not None:
        teams = TeamLedger(policy.quotas, policy.limits, snapshot.running, snapshot.groups)
        for k, o in taken:
            teams.take(k, o)
        team = teams.factor(run_class, owner)
        if team["state"] == "quota_reached" or (team["state"] == "borrowing" and reason == CLASS_LIMIT_REACHED):
            return TEAM_QUOTA_REACHED, {k: team[k] for k in ("team", "quota", "held", "borrowing_limit")}
    if reason is not None:
        return reason, None
    rules = policy.fairness.of(run_class)
    if owner is not None and user_blocked(rules, snapshot.held_by_owner(), run_class, owner):
        mine = snapshot.held_by_owner().get((run_class, owner), 0)
        return USER_LIMIT_REACHED, {"max_running_per_user": rules.max_running_per_user, "held": mine}
    if gpu_blocked(policy, snapshot.held_gpus(), run_class, demand):
        limit = policy.classes[run_class].gpu_limit
        return GPU_LIMIT_REACHED, {"gpu_limit": limit, "held_gpus": snapshot.held_gpus()[run_class] / 1000}
    free = snapshot.free
    if not snapshot.capacity or pack(demand, free, strategy) is None:
        return INSUFFICIENT_RESOURCES, fit_detail(demand, free, capacity_known=bool(snapshot.capacity))
    return HIGHER_PRIORITY_WAITING, None


def _resource_eta(
    snapshot: Snapshot, demand: tuple[Res, ...], strategy: str, now: datetime, finishes: dict[int, float]
) -> float | None:
    """Seconds until the run would fit if the held runs end at their predicted finishes (`finishes`). None: not
    known, when a held run has no predicted finish (its time limit is a bound, never shown as an estimate)."""
    if any(h.run_id not in finishes for h in snapshot.running):
        return None
    endings = [(datetime.fromtimestamp(finishes[h.run_id], tz=UTC), h.demand, h.placement) for h in snapshot.running]
    at = shadow_time(demand, strategy, snapshot.free, endings, now)
    return None if at is None else round((at - now).total_seconds(), 1)


def runs_queue_info(*, runs: list[Run]) -> dict[int, QueueInfo]:
    """Position (in class, overall, 1-based), pending reason (with detail) and ETA for each queued run in `runs`.
    The runs' `resources` are read when loaded (a run built without them counts as needing nothing)."""
    queued = [r for r in runs if r.status == RunStatus.QUEUED]
    if not queued:
        return {}
    policy = store.policy_load()
    running = store.held_load()
    held = {k: 0 for k in CLASSES}
    for h in running:
        held[h.run_class] += 1
    snapshot = Snapshot(policy=policy, held=held, capacity=store.capacity_load(), running=running)
    snapshot = with_groups(snapshot, extra_owners=[r.owner_id for r in queued])
    now = timezone.now()
    rate = grant_rate_per_second(now=now)
    out: dict[int, QueueInfo] = {}
    if policy.fairness != Fairness():  # the order is not the seed's: rank the whole queue as grants take it
        positions = positions_ranked(policy, {r.pk for r in queued}, timezone.now())
    else:
        positions = (_positions_by_scan if len(queued) > SCAN_THRESHOLD else _positions_by_count)(policy, queued)
    finishes = active_finishes(now=now)
    starts = queue_starts(
        finishes=sorted(finishes.values()),
        run_seconds=typical_run_seconds(now=now),
        now=now.timestamp(),
        positions=max((p[1] for p in positions.values()), default=0),
    )
    for run in queued:
        if run.pk not in positions:
            continue
        in_class, overall = positions[run.pk]
        demand, strategy = _demand(run.__dict__.get("resources"))
        reason, detail = wait_reason(snapshot, run.run_class, demand, strategy, owner=run.owner_id)
        start = starts[overall - 1]
        eta = round(start - now.timestamp(), 1) if start is not None else (round(overall / rate, 1) if rate else None)
        if reason == INSUFFICIENT_RESOURCES:
            wait = _resource_eta(snapshot, demand, strategy, now, finishes) if snapshot.capacity else None
            eta = None if wait is None else max(eta or 0.0, wait)
        out[run.pk] = QueueInfo(
            position_in_class=in_class,
            position_overall=overall,
            pending_reason=reason,
            eta_seconds=eta,
            pending_detail=detail,
        )
    return out


def slot_dry_run(
    *, origin: Any, resources: Any = None, time_limit_seconds: int | None = None, owner: int = 0
) -> dict[str, Any]:
    """Would a run of this origin (and demand: `resources`, the demand JSON; none: it needs nothing) be granted
    if `owner` submitted it now (fair share and per-user limits count that owner)? If not, why it would wait, and
    for a class that preempts, which runs the tick would preempt for it (`would_preempt`)."""
    if origin not in Origin.values:
        raise InvalidInput(f"unknown origin {origin!r}; expected one of {', '.join(Origin.values)}", field="origin")
    run_class = ORIGIN_TO_CLASS[origin]
    policy = store.policy_load()
    snapshot = store.snapshot_load(policy)
    now = timezone.now()
    demand, strategy = _demand(resources)
    phantom = WaitingSlot(
        run_id=-1,
        requested_at=now + timedelta(days=36500),
        demand=demand,
        strategy=strategy,
        time_limit_seconds=time_limit_seconds,
        owner=owner,
    )
    waiting = {k: list(v) for k, v in snapshot.waiting.items()}
    waiting.setdefault(run_class, []).append(phantom)
    trial = with_groups(replace(snapshot, waiting=waiting), extra_owners=[owner])
    result = plan(trial, now)
    granted = any(d.run_id == -1 for d in result.decisions)
    reason, detail = None, None
    if not granted:
        after = dict(snapshot.held)
        for d in result.decisions:
            after[d.run_class] = after.get(d.run_class, 0) + 1
        owners = {w.run_id: w.owner for q in trial.waiting.values() for w in q}
        taken = [(d.run_class, owners[d.run_id]) for d in result.decisions]
        reason, detail = wait_reason(trial, run_class, demand, strategy, held=after, owner=owner, taken=taken)
    return {
        "origin": origin,
        "run_class": run_class,
        "granted": granted,
        "pending_reason": reason,
        "pending_detail": detail,
        "would_preempt": [] if granted else would_preempt(policy, phantom, run_class, now),
    }
