"""Run comparison (GET /api/runs/compare/, the /compare/ page): which runs were asked for, their train
metrics as downsampled columns, and the config keys whose values differ.

Reads only; the same visibility rule as every run read (runs.selectors.run_list: own runs, staff all).
"""

from __future__ import annotations

import math
from typing import Any

from django.db import connection
from django.db.models import Count, ExpressionWrapper, F, IntegerField, JSONField, Window
from django.db.models.expressions import RawSQL
from django.db.models.functions import Mod, RowNumber

from runs.errors import InvalidInput
from runs.messages import CompareJson, CompareRun, ConfigDiffRow
from runs.models import Run, RunEvent
from runs.selectors import run_list
from trainer.step_schema import TrainData

COMPARE_RUNS_MAX = 10
# Train-event keys compared: the declared number fields (trainer/step_schema.py TrainData); nothing else a job
# posted becomes a column, so a run has at most this many metrics.
COMPARE_METRICS: frozenset[str] = frozenset(
    name for name, info in TrainData.model_fields.items() if info.annotation in (float, float | None)
) | frozenset({"staleness_max", "groups", "steps_total"})
COMPARE_POINTS_MAX = 1000  # per run: a 10,000-step run comes back as every 10th step
_ID_DIGITS_MAX = 18  # 18 digits fit a signed 64-bit id
_NOT_METRICS = frozenset({"step"})


def compare_ids_parse(raw: str | None) -> list[int]:
    """`runs=1,2,3` -> [1, 2, 3] (duplicates dropped, order kept); InvalidInput naming `runs` otherwise."""
    if raw is None or not raw.strip():
        raise InvalidInput(f"expected 1 to {COMPARE_RUNS_MAX} comma-separated run ids, e.g. runs=1,2,3", field="runs")
    parts = [p.strip() for p in raw.split(",")]
    if len(parts) > COMPARE_RUNS_MAX:
        raise InvalidInput(f"at most {COMPARE_RUNS_MAX} runs can be compared, got {len(parts)}", field="runs")
    ids: list[int] = []
    for part in parts:
        # ASCII only: str.isdigit() is also true for "²" and "١".
        if not (part.isascii() and part.isdigit()) or len(part) > _ID_DIGITS_MAX or int(part) < 1:
            shown = part if len(part) <= 20 else part[:20] + "…"
            raise InvalidInput(f"run ids are positive integers, got {shown!r}", field="runs")
        if int(part) not in ids:
            ids.append(int(part))
    return ids


_MISSING = object()


def config_flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """Nested objects -> one level with dotted keys ({"a": {"b": 1}} -> {"a.b": 1}); lists are values."""
    if not isinstance(config, dict) or (not config and prefix):
        return {prefix: config} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        flat.update(config_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def config_diff(configs: list[Any]) -> list[ConfigDiffRow]:
    """The flattened keys whose value is not the same in every config (a key one config lacks differs),
    sorted by key. With fewer than two configs nothing differs."""
    if len(configs) < 2:
        return []
    flats = [config_flatten(c) for c in configs]
    rows: list[ConfigDiffRow] = []
    for key in sorted({k for f in flats for k in f}):
        values = [f.get(key, _MISSING) for f in flats]
        first = values[0]
        # 1 == 1.0 == True in Python: compare types too, so `true` and `1` count as different values.
        if all(v is not _MISSING and first is not _MISSING and type(v) is type(first) and v == first for v in values):
            continue
        rows.append(
            ConfigDiffRow(
                key=key,
                values=[None if v is _MISSING else v for v in values],
                missing=[v is _MISSING for v in values],
            )
        )
    return rows


def _number(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


# Keys of train data that are not scalars and can be large; on PostgreSQL they are cut before they leave the
# database (`jsonb - key`), elsewhere they are read and skipped.
_HEAVY_KEYS = ("histograms", "group_ids", "epochs")


def _train_rows(run_ids: list[int], points: int) -> tuple[dict[int, int], list[tuple[int, Any, dict[str, Any]]]]:
    """Train events stored per run, and (run_id, ts, data) of at most `points` of each run's train events, in seq
    order, evenly spaced and always the last: the rows whose distance from the last is a multiple of
    ceil(n / points)."""
    qs = (
        RunEvent.objects.filter(run_id__in=run_ids, type="train")
        .annotate(
            rn=Window(RowNumber(), partition_by=[F("run_id")], order_by=F("seq").asc()),
            n=Window(Count("id"), partition_by=[F("run_id")]),
        )
        .annotate(stride=ExpressionWrapper((F("n") + (points - 1)) / points, output_field=IntegerField()))
        .annotate(offset=Mod(F("n") - F("rn"), F("stride")))
        .filter(offset=0)
    )
    # Pick the rows by id first: the window runs over narrow rows, and only the picked `data` is read.
    picked = list(qs.values_list("id", "run_id", "n"))
    counts = {run_id: n for _id, run_id, n in picked}
    rows = RunEvent.objects.filter(id__in=[p[0] for p in picked]).order_by("run_id", "seq")
    if connection.vendor == "postgresql":
        cut = "".join(f" - '{key}'" for key in _HEAVY_KEYS)  # literals of this module, not input
        rows = rows.annotate(scalars=RawSQL(f'"runs_runevent"."data"{cut}', [], output_field=JSONField()))
        return counts, list(rows.values_list("run_id", "ts", "scalars"))
    return counts, list(rows.values_list("run_id", "ts", "data"))


def run_compare(*, user: Any, run_ids: list[int], points: int = COMPARE_POINTS_MAX) -> CompareJson:
    """The comparison of `run_ids` as `user` sees it (runs.messages.CompareJson)."""
    visible = {r.pk: r for r in run_list(user=user).filter(pk__in=run_ids)}
    runs: list[Run] = [visible[i] for i in run_ids if i in visible]
    counts, rows = _train_rows(list(visible), points) if visible else ({}, [])
    out: dict[int, CompareRun] = {}
    for run in runs:
        n = counts.get(run.pk, 0)
        out[run.pk] = CompareRun(
            id=run.pk,
            name=run.name,
            owner=run.owner.username,
            status=run.status,
            steps=n,
            stride=max(1, math.ceil(n / points)),
            step=[],
            elapsed=[],
            metrics={},
        )
    origin: dict[int, float] = {r.pk: r.started_at.timestamp() for r in runs if r.started_at}
    for run_id, ts, data in rows:
        col = out[run_id]
        i = len(col["step"])
        t0 = origin.setdefault(run_id, ts.timestamp())
        step = data.get("step")
        col["step"].append(step if isinstance(step, int) and not isinstance(step, bool) else i + 1)
        col["elapsed"].append(round(ts.timestamp() - t0, 3))
        for key, value in data.items():
            v = _number(value) if key in COMPARE_METRICS else None
            if v is None or key in _NOT_METRICS:
                continue
            series = col["metrics"].setdefault(key, [None] * i)
            series.extend([None] * (i - len(series)))
            series.append(v)
    for col in out.values():  # pad metrics a later event stopped reporting
        for series in col["metrics"].values():
            series.extend([None] * (len(col["step"]) - len(series)))
    return CompareJson(
        runs=[out[r.pk] for r in runs],
        not_found=[i for i in run_ids if i not in visible],
        metrics=sorted({k for c in out.values() for k in c["metrics"]}),
        config_diff=config_diff([r.config for r in runs]),
    )
