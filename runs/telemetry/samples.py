"""Captured samples of a run (`sample` events, trainer/sample_schema.py): the one writer of Sample rows and
their per-run retention.

Ingest (runs/telemetry/ingest.py) hands the sample events of a post here instead of the event stream: they get no
platform seq, are not streamed live, do not count against the event budget (runs/telemetry/retention.py) and are not
folded into the run summary. A run keeps its newest `samples_keep` samples (its config; default
DEFAULT_SAMPLES_KEEP), never more than settings.SAMPLES_MAX_PER_RUN: past it the oldest (lowest ids) are
deleted. Ids of the samples kept never change, so a sample's URL stays valid while it is kept.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from runs.core.events import event_ts
from runs.models import Run, Sample
from trainer.config import TrainConfig

DEFAULT_SAMPLES_KEEP = TrainConfig.samples_keep  # the trainer's default, one source
COLUMNS = (
    "step",
    "group",
    "index",
    "prompt_index",
    "session",
    "engine",
    "finish_reason",
    "pick",
    "reward",
    "advantage",
    "version_min",
    "version_max",
    "staleness",
    "length",
    "prompt",
    "completion",
)


def samples_keep(run: Run) -> int:
    """How many samples the run keeps: its config's `samples_keep`, capped by SAMPLES_MAX_PER_RUN."""
    most = max(0, int(getattr(settings, "SAMPLES_MAX_PER_RUN", 200_000)))
    wanted = (run.config or {}).get("samples_keep", DEFAULT_SAMPLES_KEEP)
    if not isinstance(wanted, int) or isinstance(wanted, bool):
        wanted = DEFAULT_SAMPLES_KEEP
    return max(0, min(wanted, most))


def samples_record(*, run: Run, source: str, items: list[dict[str, Any]]) -> int:
    """Store validated sample events (ingest items: {type, data, ts, source_seq}) once each; returns how many
    were new. Call inside the ingest transaction (which holds the run row lock)."""
    if not items:
        return 0
    keep = samples_keep(run)
    seqs = [item["source_seq"] for item in items]
    seen = set(
        Sample.objects.filter(run_id=run.pk, source=source, source_seq__in=seqs).values_list("source_seq", flat=True)
    )
    rows: list[Sample] = []
    for item in items:
        if item["source_seq"] in seen:
            continue
        seen.add(item["source_seq"])
        data = item["data"]
        rows.append(
            Sample(
                run_id=run.pk,
                source=source,
                source_seq=item["source_seq"],
                ts=event_ts(item.get("ts")),
                data={"turns": data["turns"], "reward_parts": data["reward_parts"]},
                **{key: data[key] for key in COLUMNS},
            )
        )
    if keep == 0 or not rows:
        return len(rows)
    Sample.objects.bulk_create(rows[-keep:], ignore_conflicts=True)
    samples_trim(run=run, keep=keep)
    return len(rows)


def samples_trim(*, run: Run, keep: int) -> int:
    """Delete the run's oldest samples past `keep`; returns how many were deleted."""
    ids = Sample.objects.filter(run_id=run.pk).order_by("-id").values_list("id", flat=True)
    cut = ids[keep : keep + 1].first()
    if cut is None:
        return 0
    deleted, _ = Sample.objects.filter(run_id=run.pk, id__lte=cut).delete()
    return deleted
