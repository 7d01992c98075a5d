"""Reads only the dashboard needs on top of runs.selectors: recent metric history for the board's sparklines."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from django.db.models import F, Window
from django.db.models.functions import RowNumber

from runs.models import RunEvent


def reward_histories(*, run_ids: Iterable[int], limit: int = 40) -> dict[int, list[float]]:
    """The last `limit` train-event `reward_mean` values of each run, oldest first (one query)."""
    ids = list(run_ids)
    if not ids:
        return {}
    rows = (
        RunEvent.objects.filter(run_id__in=ids, type="train")
        .annotate(rank=Window(RowNumber(), partition_by=[F("run_id")], order_by=F("seq").desc()))
        .filter(rank__lte=limit)
        .values_list("run_id", "seq", "data")
    )
    out: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for run_id, seq, data in rows:
        value = (data or {}).get("reward_mean")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[run_id].append((seq, float(value)))
    return {run_id: [v for _, v in sorted(pairs)] for run_id, pairs in out.items()}
