"""Reads: runs visible to a user, queue position / pending reason / ETA of queued runs, slot snapshot, dry-run."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from runs.errors import InvalidInput, RunNotFound
from runs.models import ORIGIN_TO_CLASS, Origin, Run, RunClass, RunEvent, RunStatus, Slot, SlotState
from runs.slots import store
from runs.slots.grant import HIGHER_PRIORITY_WAITING, Snapshot, WaitingSlot, blocking_reason, grant
from runs.slots.policy import CLASSES, Policy

# ETA: grant rate over the most recent grants within this window.
ETA_WINDOW = timedelta(minutes=30)
ETA_SAMPLE = 50


@dataclass(frozen=True)
class QueueInfo:
    position_in_class: int
    position_overall: int
    pending_reason: str
    eta_seconds: float | None


def run_list(*, user: Any, status: str | None = None, run_class: str | None = None) -> QuerySet[Run]:
    """Runs the user may see (own runs; staff: all), newest first, optionally filtered (values validated)."""
    if status is not None and status not in RunStatus.values:
        raise InvalidInput(f"unknown status {status!r}; expected one of {', '.join(RunStatus.values)}", field="status")
    if run_class is not None and run_class not in RunClass.values:
        raise InvalidInput(f"unknown run class {run_class!r}; expected one of {', '.join(RunClass.values)}",
                           field="run_class")
    qs = Run.objects.select_related("owner").order_by("-id")
    if not user.is_staff:
        qs = qs.filter(owner=user)
    if status is not None:
        qs = qs.filter(status=status)
    if run_class is not None:
        qs = qs.filter(run_class=run_class)
    return qs


def run_get(*, user: Any, run_id: int) -> Run:
    """A run the user may see; others' runs are reported as not found (their existence is not revealed)."""
    if not 0 < run_id < 2**63:
        raise RunNotFound(f"run {run_id} not found")
    run = run_list(user=user).filter(pk=run_id).first()
    if run is None:
        raise RunNotFound(f"run {run_id} not found")
    return run


def run_events_list(*, run: Run, after: int = 0, limit: int = 1000) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run=run, seq__gt=after).order_by("seq")[:limit])


def grant_rate_per_second(*, now: datetime) -> float | None:
    """Recent grants per second (None when nothing was granted lately)."""
    recent = list(
        Run.objects.filter(granted_at__gte=now - ETA_WINDOW).order_by("-granted_at")
        .values_list("granted_at", flat=True)[:ETA_SAMPLE]
    )
    if not recent:
        return None
    span = max((now - recent[-1]).total_seconds(), 1.0)
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


# Above this many queued runs in one call, one scan of the queue beats per-run counts.
SCAN_THRESHOLD = 8


def runs_queue_info(*, runs: list[Run]) -> dict[int, QueueInfo]:
    """Position (in class, overall, 1-based), pending reason and ETA for each queued run in `runs`."""
    queued = [r for r in runs if r.status == RunStatus.QUEUED]
    if not queued:
        return {}
    policy = store.policy_load()
    held = store.held_counts()
    rate = grant_rate_per_second(now=timezone.now())
    locate = _positions_by_scan if len(queued) > SCAN_THRESHOLD else _positions_by_count
    out: dict[int, QueueInfo] = {}
    positions = locate(policy, queued)
    for run in queued:
        if run.pk not in positions:
            continue
        in_class, overall = positions[run.pk]
        reason = blocking_reason(policy, held, run.run_class) or HIGHER_PRIORITY_WAITING
        eta = round(overall / rate, 1) if rate else None
        out[run.pk] = QueueInfo(position_in_class=in_class, position_overall=overall, pending_reason=reason,
                                eta_seconds=eta)
    return out


def slots_snapshot() -> dict[str, Any]:
    """{policy, borrowable, classes: {<class>: {running, waiting, limit, priority}}, total: {running, max_total}}."""
    policy = store.policy_load()
    counts = store.slot_counts()
    held, waiting = counts[SlotState.HELD], counts[SlotState.WAITING]
    return {
        "policy": policy.to_dict(),
        "borrowable": policy.borrowable,
        "classes": {
            k: {"running": held[k], "waiting": waiting[k], "limit": policy.classes[k].limit,
                "priority": policy.classes[k].priority}
            for k in CLASSES
        },
        "total": {"running": sum(held.values()), "max_total": policy.max_total},
    }


def slot_dry_run(*, origin: Any) -> dict[str, Any]:
    """Would a run of this origin be granted if submitted now? If not, the reason it would wait."""
    if origin not in Origin.values:
        raise InvalidInput(f"unknown origin {origin!r}; expected one of {', '.join(Origin.values)}", field="origin")
    run_class = ORIGIN_TO_CLASS[origin]
    policy = store.policy_load()
    snapshot = store.snapshot_load(policy)
    phantom = WaitingSlot(run_id=-1, requested_at=timezone.now() + timedelta(days=36500))
    waiting = {k: list(v) for k, v in snapshot.waiting.items()}
    waiting.setdefault(run_class, []).append(phantom)
    decisions = grant(Snapshot(policy=policy, held=snapshot.held, waiting=waiting), timezone.now())
    granted = any(d.run_id == -1 for d in decisions)
    reason = None
    if not granted:
        after = dict(snapshot.held)
        for d in decisions:
            after[d.run_class] = after.get(d.run_class, 0) + 1
        reason = blocking_reason(policy, after, run_class) or HIGHER_PRIORITY_WAITING
    return {"origin": origin, "run_class": run_class, "granted": granted, "pending_reason": reason}
