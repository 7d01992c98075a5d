"""Reads: runs visible to a user, the run JSON (REST and websockets), queue position / pending reason / ETA of
queued runs, slot snapshot, dry-run."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from runs.core.events import run_event_to_dict
from runs.core.visibility import may_see, visible_runs
from runs.errors import InvalidInput, RunNotFound
from runs.messages import RunJson, SlotsJson
from runs.models import Run, RunClass, RunEvent, RunStatus, SlotState
from runs.scheduling.finishes import progress_of
from runs.scheduling.queue import QueueInfo, runs_queue_info
from runs.slots import store
from runs.slots.policy import CLASSES
from trainer.events import StoredEvent


def run_list(*, user: Any, status: str | None = None, run_class: str | None = None) -> QuerySet[Run]:
    """Runs the user may see (own runs; staff: all), newest first, optionally filtered (values validated)."""
    if status is not None and status not in RunStatus.values:
        raise InvalidInput(f"unknown status {status!r}; expected one of {', '.join(RunStatus.values)}", field="status")
    if run_class is not None and run_class not in RunClass.values:
        raise InvalidInput(
            f"unknown run class {run_class!r}; expected one of {', '.join(RunClass.values)}", field="run_class"
        )
    qs = visible_runs(user, Run.objects.select_related("owner").order_by("-id"))
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


def iso(value: datetime | None) -> str | None:
    """A timestamp as the API writes it (ISO 8601 in UTC, `Z` suffix), None stays None."""
    if value is None:
        return None
    text = timezone.localtime(value, timezone.get_current_timezone()).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def run_json(run: Run, info: QueueInfo | None = None, paces: dict[str, dict[int, float]] | None = None) -> RunJson:
    """The run JSON of GET /api/runs/<id>/ and of the websocket snapshots; `position`, `pending_reason`,
    `pending_detail` and `eta_seconds` come from `info` (runs_queue_info) when the run is queued; a `starting`
    run's pending reason is the one stored on it (`waiting_for_resources` while its placement group waits,
    `starting_processes` while its processes start).
    `paces`: shared by the runs of one listing, so each kind's pace factors are read once (runs.scheduling.finishes)."""
    end = run.granted_at or run.finished_at or timezone.now()
    if run.status == RunStatus.QUEUED:
        end = timezone.now()
    reason, detail = (info.pending_reason, info.pending_detail) if info else (None, None)
    if run.status == RunStatus.STARTING and run.pending_reason:
        reason, detail = run.pending_reason, ({"message": run.pending_detail} if run.pending_detail else None)
    progress = progress_of(run, paces=paces)
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
        pending_reason=reason,
        pending_detail=detail,
        eta_seconds=info.eta_seconds if info else None,
        progress=progress.progress,
        eta_finish_seconds=progress.eta_finish_seconds,
        error=run.error,
        summary=run.summary,
        auto_resume=run.auto_resume,
        time_limit_seconds=run.time_limit_seconds,
        resources=run.resources or None,
        preempted_by=run.preempted_by_id,
        preempt_state=run.preempt_state,
        preempt_reason=run.preempt_reason,
    )


def runs_json(runs: list[Run]) -> list[RunJson]:
    """run_json of several runs, queue info and pace factors read once for all of them."""
    info = runs_queue_info(runs=runs)
    paces: dict[str, dict[int, float]] = {}
    return [run_json(run, info.get(run.pk), paces) for run in runs]


def slots_snapshot() -> SlotsJson:
    """{policy, borrowable, classes: {<class>: {running, waiting, limit, priority, gpu_limit, gpus}},
    total: {running, max_total}}."""
    policy = store.policy_load()
    counts = store.slot_counts()
    held, waiting = counts[SlotState.HELD], counts[SlotState.WAITING]
    gpus = {k: 0 for k in CLASSES}
    for h in store.held_load():
        gpus[h.run_class] = gpus.get(h.run_class, 0) + sum(b.gpu for b in h.demand)
    return {
        "policy": policy.to_dict(),
        "borrowable": policy.borrowable,
        "classes": {
            k: {
                "running": held[k],
                "waiting": waiting[k],
                "limit": policy.classes[k].limit,
                "priority": policy.classes[k].priority,
                "gpu_limit": policy.classes[k].gpu_limit,
                "gpus": gpus[k] / 1000,
            }
            for k in CLASSES
        },
        "total": {"running": sum(held.values()), "max_total": policy.max_total},
    }


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
    if not may_see(user, run.owner_id):
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
