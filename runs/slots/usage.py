"""Owners' recent usage for fair share, computed outside the pure grant and passed in (`Snapshot.usage`).

Usage is each run's granted resources (its bundles' total) times the time it ran, from `granted_at` to
`finished_at` (still running: up to now), decayed with the staff half-life and turned into DRF's dominant share
over the alive cluster's capacity (runs/slots/fairness.py). Runs that ended more than `HORIZON_HALF_LIVES`
half-lives ago count for less than 2^-20 and are not read. Loaded only when some class has fair share on, and
cached per process for `CACHE_SECONDS` (usage moves slowly next to a half-life of minutes to hours; the decay
itself is exact at the time it is read).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from runs.models import Run
from runs.slots.fairness import RESOURCE_WEIGHTS_DEFAULT, Fairness, dominant_shares
from runs.slots.grant import Snapshot
from runs.slots.policy import CLASSES
from runs.slots.resources import MILLI, Res, total

HORIZON_HALF_LIVES = 20
CACHE_SECONDS = 10.0

_lock = threading.Lock()
_cached: tuple[float, Fairness, dict[int, float]] | None = None


Span = tuple[int, datetime, datetime | None, Res]


def spans_load(*, now: datetime, half_life: int) -> list[Span]:
    """(owner, granted_at, finished_at, granted resources) of every run granted that ran within the horizon."""
    return spans_since(now - timedelta(seconds=half_life * HORIZON_HALF_LIVES))


def spans_since(since: datetime) -> list[Span]:
    """The spans of every run granted that was still running at `since` or started after it. The resources are
    the demand's stored total (`Run.resources["total"]`, read as three numbers: no per-run JSON parse); a run
    stored without one is summed from its bundles."""
    runs = Run.objects.filter(granted_at__isnull=False).filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
    totals = ("resources__total__CPU", "resources__total__GPU", "resources__total__memory")
    out = []
    missing: dict[int, tuple[int, datetime, datetime | None]] = {}
    for run_id, owner, start, end, cpu, gpu, memory in runs.values_list(
        "id", "owner_id", "granted_at", "finished_at", *totals
    ):
        if start is None:
            continue  # excluded by the filter; kept for the type
        try:
            if cpu is None and gpu is None and memory is None:
                raise ValueError("no stored total")
            out.append((owner, start, end, Res.from_json({"CPU": cpu, "GPU": gpu, "memory": memory})))
        except ValueError:  # no total, or a damaged one: sum the bundles
            missing[run_id] = (owner, start, end)
    ids = list(missing)
    for chunk in (ids[i : i + 500] for i in range(0, len(ids), 500)):  # SQLite's bound on parameters
        for run_id, resources in Run.objects.filter(id__in=chunk).values_list("id", "resources"):
            bundles = resources.get("bundles") if isinstance(resources, dict) else None
            out.append((*missing[run_id], granted(bundles)))
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


def hours_by_owner(*, now: datetime, windows: Mapping[str, int]) -> dict[str, dict[int, tuple[float, float]]]:
    """Per window (name -> seconds back from now), per owner: (CPU-hours, GPU-hours) its runs held in it (a run
    still going counts up to now): what the settings page shows per user and per team. One read of the runs, for
    the longest window."""
    out: dict[str, dict[int, tuple[float, float]]] = {name: {} for name in windows}
    if not windows:
        return out
    for owner, start, end, res in spans_since(now - timedelta(seconds=max(windows.values()))):
        for name, seconds in windows.items():
            held = (min(end or now, now) - max(start, now - timedelta(seconds=seconds))).total_seconds() / 3600
            if held > 0:
                cpu, gpu = out[name].get(owner, (0.0, 0.0))
                out[name][owner] = (cpu + res.cpu / MILLI * held, gpu + res.gpu / MILLI * held)
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
