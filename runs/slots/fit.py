"""Whether a run's demand can ever fit the cluster, and the words for why not (pure).

Submit refuses a run that `pack` cannot place even on the whole alive cluster (every node empty); the message
names the resource and the cluster's total. The queue shows `insufficient_resources` with what the run needs
and what is free now (`fit_detail`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from runs.slots.resources import MILLI, NAMES, Res, pack, total

CAPACITY_UNKNOWN = "cluster capacity not known yet"


def amount(name: str, value: int) -> str:
    """A resource amount in words: '4 GPU', '0.25 CPU', '512 MiB memory'."""
    if name == "memory":
        mib = value / (1024 * 1024)
        return f"{mib / 1024:g} GiB memory" if mib >= 1024 else f"{mib:g} MiB memory"
    return f"{value / MILLI:g} {name}"


def _get(res: Res, name: str) -> int:
    return res.values()[NAMES.index(name)]


def never_fits(bundles: Sequence[Res], strategy: str, capacity: Mapping[str, Res]) -> str | None:
    """None when the run fits the empty cluster (or capacity is not known: it waits); else why it never can,
    e.g. 'needs 4 GPU in one bundle; the cluster has 2 GPU (largest node 2)'."""
    if not capacity or pack(bundles, capacity, strategy) is not None:
        return None
    cluster = total(list(capacity.values()))
    need = total(bundles)

    def has(name: str) -> str:
        largest = max(_get(node, name) for node in capacity.values())
        return f"the cluster has {amount(name, _get(cluster, name))} (largest node {amount(name, largest).split()[0]})"

    for name in NAMES:
        if _get(need, name) > _get(cluster, name):
            return f"needs {amount(name, _get(need, name))} in total; {has(name)}"
    for name in NAMES:
        largest = max(_get(node, name) for node in capacity.values())
        if strategy == "STRICT_PACK" and _get(need, name) > largest:
            return f"needs {amount(name, _get(need, name))} on one node (STRICT_PACK); {has(name)}"
        biggest = max((_get(b, name) for b in bundles), default=0)
        if biggest > largest:
            return f"needs {amount(name, biggest)} in one bundle; {has(name)}"
    return (
        f"its {len(bundles)} bundles ({', '.join(amount(n, _get(need, n)) for n in NAMES)}) cannot be packed "
        f"onto the cluster's {len(capacity)} node(s) ({', '.join(amount(n, _get(cluster, n)) for n in NAMES)})"
    )


def fit_detail(bundles: Sequence[Res], free: Mapping[str, Res], *, capacity_known: bool) -> dict[str, Any]:
    """The `insufficient_resources` detail: what the run needs in total, what is free now (summed over nodes,
    and on the freest node)."""
    detail: dict[str, Any] = {"needs": total(bundles).to_json(), "free": total(list(free.values())).to_json()}
    if free:
        detail["largest_free_node"] = max(free.values(), key=lambda r: (r.gpu, r.cpu, r.memory)).to_json()
    if not capacity_known:
        detail["message"] = CAPACITY_UNKNOWN
    return detail


Ending = tuple[datetime | None, Sequence[Res], Sequence[str]]


def shadow_time(
    demand: Sequence[Res], strategy: str, free: Mapping[str, Res], endings: Sequence[Ending], now: datetime
) -> datetime | None:
    """The earliest time the run would fit if held runs end at their latest ends, in order (now: it fits now).
    None when that is not known: it needs a run without a time limit to end, or never fits."""
    if pack(demand, free, strategy) is not None:
        return now
    left = dict(free)
    for end, bundles, placement in sorted((e for e in endings if e[0] is not None), key=lambda e: e[0]):  # type: ignore[arg-type, return-value]
        for bundle, node in zip(bundles, placement):
            if node in left:
                left[node] = left[node] + bundle
        if pack(demand, left, strategy) is not None:
            return max(end, now) if end is not None else None
    return None
