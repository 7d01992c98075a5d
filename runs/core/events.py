"""Recording run events: the platform's per-run stream order (`seq`), per-source idempotency, and the two
stored types of a run's state.

`run_events_record` is the one writer of RunEvent rows (status changes and trainer batches alike); its
callers publish what it stored (runs.core.stores.run_events_publish), so this module imports no publisher.

A stored `status` event is a move of the platform's state machine (runs.core.lifecycle, source `platform`), one per
move, so a run's `status` events are a path of TRANSITIONS. A job reports its own state with a `status` event
too (trainer/events.py); ingest stores those under `job_status` (`stored_type`), so they never read as moves.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs.models import Run, RunEvent
from trainer.events import StoredEvent

PLATFORM_SOURCE = "platform"
STATUS = "status"  # the platform's moves: {status, previous, error}, written only by runs.core.lifecycle's stores
JOB_STATUS = "job_status"  # the job's own reports of its state: {status, version?, metrics?, error?}


def stored_type(posted: str) -> str:
    """The type a job's posted event is stored under: its `status` reports become `job_status` (the stored
    `status` type belongs to the platform's moves); every other type is stored as posted."""
    return JOB_STATUS if posted == STATUS else posted


def event_ts(ts: Any) -> datetime:
    if isinstance(ts, datetime):
        return ts
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        return datetime.fromtimestamp(float(ts), tz=UTC)
    return timezone.now()


def run_event_to_dict(event: RunEvent) -> StoredEvent:
    """The wire shape of an event: {run, seq, ts (seconds since the epoch), type, data}."""
    return StoredEvent(run=event.run_id, seq=event.seq, ts=event.ts.timestamp(), type=event.type, data=event.data)


def run_events_record(*, run: Run, source: str, events: Iterable[dict[str, Any]]) -> list[RunEvent]:
    """Append events to a run's stream and return the ones stored now.

    Each item is {type, data, ts?, source_seq?}. Items whose (source, source_seq) is already stored are
    skipped, so a re-posted batch is stored once. `seq` continues from run.last_seq under a row lock, so
    concurrent writers (ingest, status changes) never collide or leave gaps. Events are not validated here.
    """
    items = list(events)
    if not items:
        return []
    with transaction.atomic():
        last_seq = Run.objects.select_for_update().values_list("last_seq", flat=True).get(pk=run.pk)
        source_seqs = [i["source_seq"] for i in items if i.get("source_seq") is not None]
        seen: set[int | None] = set()  # source_seq is a nullable column
        if source_seqs:
            seen = set(
                RunEvent.objects.filter(run_id=run.pk, source=source, source_seq__in=source_seqs).values_list(
                    "source_seq", flat=True
                )
            )
        rows: list[RunEvent] = []
        for item in items:
            source_seq = item.get("source_seq")
            if source_seq is not None:
                if source_seq in seen:
                    continue
                seen.add(source_seq)  # a duplicate inside one batch is stored once too
            last_seq += 1
            rows.append(
                RunEvent(
                    run_id=run.pk,
                    seq=last_seq,
                    source=source,
                    source_seq=source_seq,
                    ts=event_ts(item.get("ts")),
                    type=item["type"],
                    data=item.get("data") or {},
                )
            )
        if not rows:
            return []
        RunEvent.objects.bulk_create(rows)
        Run.objects.filter(pk=run.pk).update(last_seq=last_seq)
        run.last_seq = last_seq
    return rows
