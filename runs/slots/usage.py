"""Owners' recent usage for fair share, computed outside the pure grant and passed in (`Snapshot.usage`).

Usage is each run's granted resources (its bundles' total) times the time it ran, from `granted_at` to
`finished_at` (still running: up to now), decayed with the staff half-life and turned into DRF's dominant share
over the alive cluster's capacity (runs/slots/fairness.py). Runs that ended more than `HORIZON_HALF_LIVES`
half-lives ago count for less than 2^-20 and are not read. Loaded only when some class has fair share on, and
cached per process for `CACHE_SECONDS` (usage moves slowly; the decay itself is exact at the time it is read).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from runs.models import Run
from runs.slots.fairness import RESOURCE_WEIGHTS_DEFAULT, Fairness, dominant_shares
from runs.slots.grant import Snapshot
from runs.slots.policy import CLASSES
from runs.slots.resources import Res, total

HORIZON_HALF_LIVES = 20
CACHE_SECONDS = 2.0

_lock = threading.Lock()
_cached: tuple[float, Fairness, dict[int, float]] | None = None


def spans_load(*, now: datetime, half_life: int) -> list[tuple[int, datetime, datetime | None, Res]]:
    """(owner, granted_at, finished_at, granted resources) of every run granted that ran within the horizon."""
    since = now - timedelta(seconds=half_life * HORIZON_HALF_LIVES)
    rows = (
        Run.objects.filter(granted_at__isnull=False)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
        .values_list("owner_id", "granted_at", "finished_at", "resources")
    )
    out = []
    for owner, start, end, resources in rows:
        if start is None:
            continue  # excluded by the filter; kept for the type
        bundles = resources.get("bundles") if isinstance(resources, dict) else None
        out.append((owner, start, end, granted(bundles)))
    return out


def granted(bundles: object) -> Res:
    """The total of a run's stored bundles (Run.resources["bundles"]); a damaged bundle counts as nothing, as
    in the grant's loaders."""
    out = Res()
    for bundle in bundles if isinstance(bundles, list) else []:
        try:
            out = out + Res.from_json(bundle if isinstance(bundle, dict) else {})
        except ValueError:
            continue
    return out


def usage_load(fairness: Fairness, capacity: dict[str, Res], *, now: datetime | None = None) -> dict[int, float]:
    """Owner -> weighted decayed dominant share ({} when no class has fair share on)."""
    global _cached
    if not any(fairness.of(k).fair_share for k in CLASSES):
        return {}
    clock = time.monotonic()
    with _lock:
        if _cached is not None and _cached[1] == fairness and clock - _cached[0] < CACHE_SECONDS:
            return _cached[2]
    now = now or timezone.now()
    weights = getattr(settings, "SLOTS_FAIR_SHARE_RESOURCE_WEIGHTS", RESOURCE_WEIGHTS_DEFAULT)
    shares = dominant_shares(
        spans_load(now=now, half_life=fairness.half_life_seconds),
        now=now,
        fairness=fairness,
        capacity=total(list(capacity.values())),
        resource_weights=weights,
    )
    with _lock:
        _cached = (clock, fairness, shares)
    return shares


def usage_forget() -> None:
    global _cached
    with _lock:
        _cached = None


def with_usage(snapshot: Snapshot) -> Snapshot:
    """The snapshot with its owners' usage attached (unchanged when no class has fair share on)."""
    usage = usage_load(snapshot.policy.fairness, snapshot.capacity)
    return dataclasses.replace(snapshot, usage=usage) if usage else snapshot
