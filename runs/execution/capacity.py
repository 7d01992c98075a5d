"""The tick's read of the cluster: Ray's nodes, as the platform reaches Ray (the dashboard HTTP address,
settings.RAY_ADDRESS, through Ray's state API), kept in ClusterNode rows (what admission charges runs against)
and ClusterStatus (reachable or not, when, why: what the board shows).

A node Ray reports DEAD, or no longer lists, is kept with alive=False: the node-loss sweep
(runs/execution/liveness.py) fails the runs placed on it. Dead rows are forgotten after
CLUSTER_DEAD_NODE_RETENTION_SECONDS unless a held slot is still placed on the node. When Ray cannot be read,
ClusterStatus says so and the node rows are left exactly as they were (an outage of the head is not the loss of
every node); the start of the current reachable stretch restarts the launch clock of `starting` runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from runs.core.publish import dashboard_publish
from runs.models import ClusterNode, ClusterStatus, Slot, SlotState

logger = logging.getLogger(__name__)

# Seconds one read of the node list may take; a slower head counts as unreachable for this tick.
NODES_READ_TIMEOUT_SECONDS = 5
ALIVE = "ALIVE"


class ClusterUnreachable(Exception):
    """Ray's node list could not be read (head down, dashboard not serving, timeout)."""


@dataclass(frozen=True)
class NodeSeen:
    node_id: str
    address: str
    alive: bool
    total: dict[str, float]


def node_total(resources: dict[str, Any]) -> dict[str, float]:
    """The resources admission counts ({"CPU", "GPU", "memory"}; absent ones are 0) from Ray's node totals."""
    return {key: float(resources.get(key) or 0.0) for key in ("CPU", "GPU", "memory")}


def nodes_read(address: str | None = None) -> list[NodeSeen]:
    """Every node Ray lists (alive and recently dead) through the dashboard's state API."""
    try:
        from ray.util.state import list_nodes

        nodes = list_nodes(
            address=address or settings.RAY_ADDRESS,
            detail=True,
            timeout=NODES_READ_TIMEOUT_SECONDS,
            raise_on_missing_output=False,
        )
    except Exception as exc:  # noqa: BLE001 - any failure to read means: not reachable this tick
        raise ClusterUnreachable(f"Ray at {address or settings.RAY_ADDRESS} is not reachable: {exc}") from exc
    return [
        NodeSeen(
            node_id=str(n.node_id),
            address=str(n.node_ip or ""),
            alive=n.state == ALIVE,
            total=node_total(dict(n.resources_total or {})),
        )
        for n in nodes
    ]


def cluster_status_write(*, reachable: bool, now: datetime, message: str = "") -> bool | None:
    """Record the read; returns what the previous read found (None: this is the first). When reachability
    changed, the board is told (a resync: its snapshot carries the cluster)."""
    row = ClusterStatus.objects.order_by("pk").first()
    previous = row.reachable if row is not None else None
    row = row or ClusterStatus()
    if reachable and (not previous or row.reachable_since is None):
        row.reachable_since = now
    elif not reachable:
        row.reachable_since = None
    row.reachable, row.checked_at, row.message = reachable, now, message[:2000]
    row.save()
    if previous is not reachable:
        dashboard_publish({"kind": "cluster", "reachable": reachable})
    return previous


def cluster_nodes_write(seen: list[NodeSeen], *, now: datetime) -> list[str]:
    """Upsert what Ray reported; a known node Ray no longer lists is marked not alive. Returns the ids of nodes
    that were alive and are not any more."""
    by_id = {n.node_id: n for n in seen}
    lost: list[str] = []
    with transaction.atomic():
        known = {row.node_id: row for row in ClusterNode.objects.select_for_update()}
        for node_id, row in known.items():
            fresh = by_id.get(node_id)
            alive = fresh.alive if fresh is not None else False
            if row.alive and not alive:
                lost.append(node_id)
            if fresh is not None:
                row.address, row.total, row.seen_at = fresh.address, fresh.total, now
            if fresh is not None or row.alive != alive:
                row.alive = alive
                row.save(update_fields=["address", "total", "seen_at", "alive"])
        for node_id, fresh in by_id.items():
            if node_id not in known:
                ClusterNode.objects.create(
                    node_id=node_id, address=fresh.address, alive=fresh.alive, total=fresh.total, seen_at=now
                )
        dead_nodes_prune(now=now)
    return lost


def dead_nodes_prune(*, now: datetime) -> int:
    """Forget nodes dead and unlisted for CLUSTER_DEAD_NODE_RETENTION_SECONDS (Ray gives a restarted node a new
    id, so without this the rows, and the node-loss sweep's scan of them, grow with every restart), except one
    a held slot is still placed on: the node-loss sweep must still see that one."""
    cutoff = now - timedelta(seconds=settings.CLUSTER_DEAD_NODE_RETENTION_SECONDS)
    stale = set(ClusterNode.objects.filter(alive=False, seen_at__lt=cutoff).values_list("node_id", flat=True))
    if not stale:
        return 0
    for placement in Slot.objects.filter(state=SlotState.HELD).values_list("placement", flat=True):
        stale -= {n for n in placement or [] if isinstance(n, str)}
    deleted, _ = ClusterNode.objects.filter(node_id__in=stale).delete()
    return deleted


def cluster_refresh(*, now: datetime, address: str | None = None) -> bool:
    """One read of the cluster into the database; returns whether Ray was reachable."""
    try:
        seen = nodes_read(address)
    except ClusterUnreachable as exc:
        if cluster_status_write(reachable=False, now=now, message=str(exc)) is not False:  # once, not every tick
            logger.warning("%s; runs wait, none is failed for liveness until it answers", exc)
        return False
    lost = cluster_nodes_write(seen, now=now)
    if lost:
        logger.warning("Ray nodes lost: %s", ", ".join(lost))
    if cluster_status_write(reachable=True, now=now) is False:  # back after an outage
        logger.warning("Ray at %s answers: %d node(s) alive", address or settings.RAY_ADDRESS, _alive(seen))
    return True


def _alive(seen: list[NodeSeen]) -> int:
    return sum(1 for n in seen if n.alive)


def reachable_since() -> datetime | None:
    """Start of the current reachable stretch (None: unreachable, or never read)."""
    return ClusterStatus.objects.order_by("pk").values_list("reachable_since", flat=True).first()


def cluster_reachable() -> bool:
    """What the last read found (no row yet: not known to be reachable)."""
    return bool(ClusterStatus.objects.order_by("pk").values_list("reachable", flat=True).first())
