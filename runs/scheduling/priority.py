"""The queue in grant order with fair share and bounded waiting (runs/slots/order.py), loaded from the database:
what queue positions (and so the ETA) follow when some fairness option is on, and the factors of one queued
run (GET /api/runs/<id>/priority/, with its team's quota standing: runs/slots/quota.py). One scan of the waiting
slots with their owners; usage as the grant sees it (runs/slots/usage.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from runs.models import Run, RunStatus, Slot, SlotState
from runs.slots import store
from runs.slots.grant import Snapshot, WaitingSlot
from runs.slots.order import factors, queue_order
from runs.slots.policy import CLASSES, Policy
from runs.slots.quota import TeamLedger
from runs.slots.teams import with_groups
from runs.slots.usage import usage_load


def waiting_load() -> dict[str, list[WaitingSlot]]:
    """Every waiting run per class, FIFO, with its owner (no demand: order does not depend on it)."""
    rows = (
        Slot.objects.filter(state=SlotState.WAITING)
        .order_by("requested_at", "run_id")
        .values_list("run_class", "run_id", "requested_at", "owner_id")
    )
    out: dict[str, list[WaitingSlot]] = {k: [] for k in CLASSES}
    for run_class, run_id, at, owner in rows:
        out.setdefault(run_class, []).append(WaitingSlot(run_id, at, owner=owner or 0))
    return out


def ranked(policy: Policy, now: datetime) -> tuple[list[tuple[str, WaitingSlot]], dict[int, float]]:
    """All waiting runs in grant order, and the owners' usage that ordered them."""
    usage = usage_load(policy.fairness, store.capacity_load(), now=now)
    return queue_order(policy, waiting_load(), usage, now), usage


def positions_ranked(policy: Policy, wanted: set[int], now: datetime) -> dict[int, tuple[int, int]]:
    """(in class, overall) 1-based positions in grant order of the wanted runs."""
    seen = {k: 0 for k in CLASSES}
    out: dict[int, tuple[int, int]] = {}
    for index, (run_class, slot) in enumerate(ranked(policy, now)[0]):
        seen[run_class] += 1
        if slot.run_id in wanted:
            out[slot.run_id] = (seen[run_class], index + 1)
    return out


def run_priority(*, run: Run) -> dict[str, Any]:
    """The factors placing a queued run in the order and its positions; `factors` null when it is not waiting."""
    now = timezone.now()
    out: dict[str, Any] = {"run_id": run.pk, "status": run.status, "position": None, "factors": None}
    if run.status != RunStatus.QUEUED:
        return out
    policy = store.policy_load()
    order, usage = ranked(policy, now)
    in_class = 0
    for index, (run_class, slot) in enumerate(order):
        in_class += run_class == run.run_class
        if slot.run_id != run.pk:
            continue
        snap = with_groups(Snapshot(policy=policy, held={}, running=store.held_load()), extra_owners=[slot.owner])
        held = snap.held_by_owner()
        owners = [w.owner for k, w in order if k == run_class]
        out["position"] = {"in_class": in_class, "overall": index + 1}
        out["factors"] = factors(policy, run_class, slot, usage=usage, class_owners=owners, held_by_owner=held, now=now)
        teams = TeamLedger(policy.quotas, policy.limits, snap.running, snap.groups)
        out["factors"]["team"] = teams.factor(run_class, slot.owner)
        break
    return out
