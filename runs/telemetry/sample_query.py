"""Reads of captured samples: the inspector's filters parsed from a query string (a 400 naming the field for
any bad value) and the run's samples they select. Pagination (keyset on the ordering and the id) is the API's
(runs/api/samples.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from runs.errors import InvalidInput
from runs.models import Run, Sample
from trainer.sample_schema import FINISH_REASONS, MAX_SAMPLE_NAME, PICKS

INT_MAX = 2**31 - 1
# filter parameter -> (Sample lookup, kind)
FILTERS: dict[str, tuple[str, str]] = {
    "step": ("step", "int"),
    "step_min": ("step__gte", "int"),
    "step_max": ("step__lte", "int"),
    "reward_lte": ("reward__lte", "float"),
    "reward_gte": ("reward__gte", "float"),
    "advantage_lte": ("advantage__lte", "float"),
    "advantage_gte": ("advantage__gte", "float"),
    "staleness_gte": ("staleness__gte", "int"),
    "finish_reason": ("finish_reason", "finish_reason"),
    "engine": ("engine", "name"),
    "group": ("group", "int"),
    "prompt_index": ("prompt_index", "int"),
    "pick": ("pick", "pick"),
}
ORDERINGS = ("-id", "id", "reward", "-reward", "advantage", "-advantage", "length", "-length", "step", "-step")
# Query parameters that are not filters: the ordering and the pagination's.
OTHER_PARAMS = frozenset({"ordering", "cursor", "limit"})


@dataclass(frozen=True)
class SampleQuery:
    lookups: dict[str, Any]
    ordering: str  # one of ORDERINGS; ties are broken by id in the same direction


def sample_query_parse(params: Mapping[str, str]) -> SampleQuery:
    """Filters and ordering from query parameters; unknown parameters and bad values are InvalidInput."""
    lookups: dict[str, Any] = {}
    for name in params:
        if name not in FILTERS and name not in OTHER_PARAMS:
            known = ", ".join([*FILTERS, *sorted(OTHER_PARAMS)])
            raise InvalidInput(f"unknown parameter (known: {known})", field=str(name)[:64])
    for name, (lookup, kind) in FILTERS.items():
        raw = params.get(name)
        if raw is None or raw == "":
            continue
        lookups[lookup] = _value(name, kind, raw)
    ordering = params.get("ordering") or "-id"
    if ordering not in ORDERINGS:
        raise InvalidInput(f"expected one of {', '.join(ORDERINGS)}", field="ordering")
    return SampleQuery(lookups=lookups, ordering=ordering)


def samples_select(*, run: Run, query: SampleQuery) -> QuerySet[Sample]:
    """The run's samples that match `query`'s filters (unordered: the paginator orders them)."""
    return Sample.objects.filter(run_id=run.pk, **query.lookups)


def sample_get(*, run: Run, sample_id: int) -> Sample | None:
    if not 0 < sample_id < 2**63:
        return None
    return Sample.objects.filter(run_id=run.pk, pk=sample_id).first()


def _value(name: str, kind: str, raw: str) -> Any:
    if kind == "int":
        # ASCII digits only: str.isdigit() accepts "²" and "١" too.
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or int(raw) > INT_MAX:
            raise InvalidInput(f"expected an integer from 0 to {INT_MAX}", field=name)
        return int(raw)
    if kind == "float":
        try:
            value = float(raw) if len(raw) <= 32 else math.nan
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise InvalidInput("expected a finite number", field=name)
        return value
    if kind == "finish_reason":
        if raw not in FINISH_REASONS:
            raise InvalidInput(f"expected one of {', '.join(sorted(FINISH_REASONS))}", field=name)
        return raw
    if kind == "pick":
        if raw not in PICKS:
            raise InvalidInput(f"expected one of {', '.join(sorted(PICKS))}", field=name)
        return raw
    if len(raw) > MAX_SAMPLE_NAME:
        raise InvalidInput(f"expected at most {MAX_SAMPLE_NAME} characters", field=name)
    return raw
