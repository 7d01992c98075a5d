"""What preemption decides on (docs/slots.md "Preemption"): the grant's snapshot with every class's waiting heads
(a class at its limit included: that is when a run preempts), and what the pure selection
(runs/slots/preempt.py) needs to know of each held run (its latest checkpoint, its preemptions of the last 24
hours, an open preemption, whether it can be stopped now). Read under the grant lock by the tick
(runs/execution/preempt.py), and without it by the dry-run (`would_preempt`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Max

from runs.models import Preemption, Run, RunEvent, RunStatus, Slot, SlotState
from runs.slots import columns, store
from runs.slots.fairness import owner_prefix
from runs.slots.grant import BACKFILL_WINDOW, Snapshot, WaitingSlot
from runs.slots.policy import CLASSES, Policy
from runs.slots.preempt import HeldState, choose
from runs.slots.teams import with_groups

DAY = timedelta(days=1)
COLUMNS = ("run_class", "run_id", "requested_at", "demand", "strategy", "time_limit_seconds", "owner_id")


def preempt_snapshot(policy: Policy) -> Snapshot:
    """The grant's snapshot, with each class's first BACKFILL_WINDOW waiting runs in FIFO order (each owner's
    prefix in a class ordered per owner): the heads a preempting run is among, whatever the class's headroom."""
    base = store.snapshot_load(policy)
    fifo = Slot.objects.filter(state=SlotState.WAITING).order_by("requested_at", "run_id").values_list(*COLUMNS)
    waiting: dict[str, list[WaitingSlot]] = {}
    for run_class in CLASSES:
        rows: Any = fifo.filter(run_class=run_class)
        if policy.per_owner(run_class):
            rows = owner_prefix(rows, BACKFILL_WINDOW, lambda r: r[-1])
        else:
            rows = rows[:BACKFILL_WINDOW]
        waiting[run_class] = [columns.waiting_slot(run_id, *rest) for _k, run_id, *rest in rows]
    return with_groups(replace(base, waiting={k: q for k, q in waiting.items() if q}))


def held_states(snapshot: Snapshot, now: datetime) -> dict[int, HeldState]:
    """Per held run: its latest checkpoint event's time, its preemptions requested in the last 24 hours, the
    waiting run an open preemption of it makes room for, and whether it is `running` (only running runs are
    stopped for another: a starting one has nothing to lose yet, a stopping one is going anyway). Four queries."""
    ids = [h.run_id for h in snapshot.running]
    status = dict(Run.objects.filter(pk__in=ids).values_list("pk", "status"))
    checkpoints = dict(
        RunEvent.objects.filter(run_id__in=ids, type="checkpoint")
        .values("run_id")
        .annotate(at=Max("ts"))
        .values_list("run_id", "at")
    )
    recent = Preemption.objects.filter(run_id__in=ids, requested_at__gt=now - DAY)
    counts = dict(recent.values("run_id").annotate(n=Count("id")).values_list("run_id", "n"))
    open_for = dict(
        Preemption.objects.filter(run_id__in=ids, ended_at__isnull=True).values_list("run_id", "preempted_by_id")
    )
    return {
        run_id: HeldState(
            checkpoint_at=checkpoints.get(run_id),
            preemptions_today=counts.get(run_id, 0),
            preempting_for=(open_for[run_id] or 0) if run_id in open_for else None,  # 0: that run is gone
            stoppable=status.get(run_id) == RunStatus.RUNNING,
        )
        for run_id in ids
    }


def would_preempt(policy: Policy, phantom: WaitingSlot, run_class: str, now: datetime) -> list[dict[str, Any]]:
    """The dry-run's answer for a run of `run_class` submitted now (`phantom`, at the end of its class): the
    runs that would be preempted for it, as the tick would choose them ([] when none, or the class preempts not)."""
    if not policy.preemption.of(run_class).preempts:
        return []
    trial = preempt_snapshot(policy)
    waiting = {k: list(q) for k, q in trial.waiting.items()}
    waiting.setdefault(run_class, []).append(phantom)
    victims = choose(with_groups(replace(trial, waiting=waiting)), now, held_states(trial, now))
    mine = [v for v in victims if v.for_run == phantom.run_id]
    return [{"run": v.run_id, "run_class": v.run_class, "reason": v.reason} for v in mine]
