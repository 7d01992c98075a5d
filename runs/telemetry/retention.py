"""Per-run retention of stored events: a run's event table cannot grow without bound.

The budget is `EVENTS_MAX_PER_RUN` stored events per run (settings; default 50,000). Below half of it every
posted event is stored. From half of it on, the high-rate types (HIGH_RATE) are thinned: only events whose
emitter seq is a multiple of `EVENTS_DOWNSAMPLE_EVERY` are stored; other types still are. From the budget on,
ingest stores nothing more. The platform's own `status` events (its moves, written by runs.core.lifecycle's stores,
not ingest) are never subject to the budget, so a run's lifecycle is always complete; the job's reports of its
state (`job_status`, runs.core.events) are posted events like any other and count against it.

Nothing is ever deleted: an event is kept or dropped when it is posted, before it gets a platform seq, so the
stored stream stays gapless (1..last_seq) and replay by seq keeps its contract (docs/realtime.md). A dropped
event still updates the run summary (the board and run header stay current); it is not sent live.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

# Types a job may post many times a second (per step, per rollout batch, per log line).
HIGH_RATE: frozenset[str] = frozenset({"train", "rollout", "sampler", "log"})


def events_budget() -> tuple[int, int]:
    """(stored events per run, keep 1 in N high-rate events past half the budget)."""
    return (
        max(1, int(getattr(settings, "EVENTS_MAX_PER_RUN", 50_000))),
        max(1, int(getattr(settings, "EVENTS_DOWNSAMPLE_EVERY", 10))),
    )


def events_keep(*, stored: int, items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split a validated batch (run_events_record items, in order) into (to store, dropped), given how many
    events the run has stored (its last_seq: seqs are gapless). Deterministic per item, so a re-post of a
    dropped event is dropped again. Duplicates are counted as if stored (the budget errs on the safe side)."""
    cap, every = events_budget()
    soft = cap // 2
    kept: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    count = stored
    for item in items:
        if count >= cap:
            dropped.append(item)
            continue
        if count >= soft and item["type"] in HIGH_RATE and (item.get("source_seq") or 0) % every:
            dropped.append(item)
            continue
        kept.append(item)
        count += 1
    return kept, dropped
