"""Stored slot columns -> the grant's types: bundles, placement, node totals, held and waiting slots. One parser
for both loaders (the ORM one in store.py and the PostgreSQL statement's in pg_snapshot.py), so they read damaged
values the same way. Pure: no Django."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runs.slots.grant import HeldSlot, WaitingSlot
from runs.slots.resources import Res


def demand_of(bundles: Any) -> tuple[Res, ...]:
    """Stored bundle JSON (Slot.demand) -> resource vectors; a damaged entry counts as nothing."""
    out = []
    for bundle in bundles if isinstance(bundles, list) else []:
        try:
            out.append(Res.from_json(bundle if isinstance(bundle, dict) else {}))
        except ValueError:
            out.append(Res())
    return tuple(out)


def placement_of(placement: Any) -> tuple[str, ...]:
    """Stored placement JSON (Slot.placement) -> the node id of each bundle; a damaged entry is no node."""
    return tuple(p if isinstance(p, str) else "" for p in (placement if isinstance(placement, list) else []))


def held_slot(run_id: int, run_class: str, at: Any, limit: int | None, demand: Any, placement: Any, owner) -> HeldSlot:
    """A held slot from its stored columns (the ORM loader; pg_snapshot.py parses the same columns the same way)."""
    return HeldSlot(run_id, run_class, at, limit, demand_of(demand), placement_of(placement), owner or 0)


def waiting_slot(run_id: int, at: datetime, demand: Any, strategy: str, limit: int | None, owner: Any) -> WaitingSlot:
    return WaitingSlot(run_id, at, demand_of(demand), strategy or "PACK", limit, owner or 0)


def node_total_of(node_total: Any) -> Res:
    """A node's stored total JSON (ClusterNode.total) -> its capacity (a damaged total counts as empty)."""
    try:
        return Res.from_json(node_total if isinstance(node_total, dict) else {})
    except ValueError:
        return Res()


def capacity_of(rows: Any) -> dict[str, Res]:
    """(node_id, total JSON) of alive nodes -> capacity per node."""
    return {node_id: node_total_of(node_total) for node_id, node_total in rows}
