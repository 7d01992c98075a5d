"""Reads: runs visible to a user, the run JSON (REST and websockets), queue position / pending reason / ETA of
queued runs, slot snapshot, dry-run."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from runs.errors import InvalidInput, RunNotFound
from runs.events import run_event_to_dict
from runs.messages import RunJson, SlotsJson
from runs.models import (
    ORIGIN_TO_CLASS,
    Origin,
    Run,
    RunClass,
    RunEvent,
    RunStatus,
    Slot,
    SlotState,
)
from runs.slots import store
from runs.slots.grant import (
    HIGHER_PRIORITY_WAITING,
    Snapshot,
    WaitingSlot,
    blocking_reason,
    grant,
)
from runs.slots.policy import CLASSES, Policy
from trainer.events import StoredEvent

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
        raise InvalidInput(
            f"unknown run class {run_class!r}; expected one of {', '.join(RunClass.values)}", field="run_class"
        )
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
        Run.objects.filter(granted_at__gte=now - ETA_WINDOW)
        .order_by("-granted_at")
        .values_list("granted_at", flat=True)[:ETA_SAMPLE]
    )
    if not recent:
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
        out[run.pk] = QueueInfo(
            position_in_class=in_class, position_overall=overall, pending_reason=reason, eta_seconds=eta
        )
    return out


def iso(value: datetime | None) -> str | None:
    """A timestamp as the API writes it (ISO 8601 in UTC, `Z` suffix), None stays None."""
    if value is None:
        return None
    text = timezone.localtime(value, timezone.get_current_timezone()).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def run_json(run: Run, info: QueueInfo | None = None) -> RunJson:
    """The run JSON of GET /api/runs/<id>/ and of the websocket snapshots; `position`, `pending_reason` and
    `eta_seconds` come from `info` (runs_queue_info) and are null unless the run is queued."""
    end = run.granted_at or run.finished_at or timezone.now()
    if run.status == RunStatus.QUEUED:
        end = timezone.now()
    return RunJson(
        id=run.pk,
        name=run.name,
        origin=run.origin,
        run_class=run.run_class,
        kind=run.kind,
        status=run.status,
        owner=run.owner.username,
        config=run.config,
        created_at=iso(run.created_at) or "",
        granted_at=iso(run.granted_at),
        started_at=iso(run.started_at),
        finished_at=iso(run.finished_at),
        queued_seconds=round(max(0.0, (end - run.created_at).total_seconds()), 3),
        position={"in_class": info.position_in_class, "overall": info.position_overall} if info else None,
        pending_reason=info.pending_reason if info else None,
        eta_seconds=info.eta_seconds if info else None,
        error=run.error,
        summary=run.summary,
        auto_resume=run.auto_resume,
        time_limit_seconds=run.time_limit_seconds,
    )


def runs_json(runs: list[Run]) -> list[RunJson]:
    """run_json of several runs, queue info read once for all of them."""
    info = runs_queue_info(runs=runs)
    return [run_json(run, info.get(run.pk)) for run in runs]


def slots_snapshot() -> SlotsJson:
    """{policy, borrowable, classes: {<class>: {running, waiting, limit, priority}}, total: {running, max_total}}."""
    policy = store.policy_load()
    counts = store.slot_counts()
    held, waiting = counts[SlotState.HELD], counts[SlotState.WAITING]
    return {
        "policy": policy.to_dict(),
        "borrowable": policy.borrowable,
        "classes": {
            k: {
                "running": held[k],
                "waiting": waiting[k],
                "limit": policy.classes[k].limit,
                "priority": policy.classes[k].priority,
            }
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


# --- what a /ws/runs/<id>/ connection reads ------------------------------------------------------------


@dataclass(frozen=True)
class StreamOpening:
    """What a /ws/runs/<id>/ connection starts with, or why it is refused."""

    refusal: str | None  # "not_found" | "forbidden" | "after_beyond" | None
    snapshot: RunJson | None = None  # the run JSON, summary folded up to last_seq (one row read)
    last_seq: int = 0
    replay: list[StoredEvent] = field(default_factory=list)  # first page of events after `replay_from`
    replay_from: int = 0  # replay starts after this seq: `after`, or later when more than replay_max are behind


def run_stream_open(
    *, run_id: int, user: Any, after: int | None, limit: int, replay_max: int | None = None
) -> StreamOpening:
    """Permission check (owner or staff), snapshot and the first replay page, in one database session.
    With `replay_max`, the replay covers at most the newest `replay_max` events (`replay_from` says where)."""
    run = Run.objects.select_related("owner").filter(pk=run_id).first()
    if run is None:
        return StreamOpening(refusal="not_found")
    if not (user.is_staff or run.owner_id == user.pk):
        return StreamOpening(refusal="forbidden")
    if after is not None and after > run.last_seq:
        return StreamOpening(refusal="after_beyond")
    start = after or 0
    if after is not None and replay_max is not None:
        start = max(after, run.last_seq - replay_max)
    replay = run_events_after(run_id=run_id, after=start, limit=limit) if after is not None else []
    return StreamOpening(
        refusal=None, snapshot=runs_json([run])[0], last_seq=run.last_seq, replay=replay, replay_from=start
    )


def runs_last_seq(*, run_ids: list[int]) -> dict[int, int]:
    return dict(Run.objects.filter(pk__in=run_ids).values_list("pk", "last_seq"))


def run_events_after(*, run_id: int, after: int, limit: int) -> list[StoredEvent]:
    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:limit]
    return [run_event_to_dict(row) for row in rows]
