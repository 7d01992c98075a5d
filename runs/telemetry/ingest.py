"""Event ingest: check a job's per-run token, validate its event batch, store it once, fold the run summary,
count every accepted post as a heartbeat (an empty one, `{"events": []}`, is only that), apply the job's
`resources` events to a `starting` run (waiting: pending reason; ready: running, with its real placement;
timeout: back to the queue), record where its session server listens (its latest `serving` event whose URL
survived vetting: runs/execution/serving.py), and finish the run when the batch holds the job's final report of its
state (its `status` event, stored as `job_status`: succeeded, failed): at once, in the same request, not at the next
tick. Each reply carries the staff commands the job has not answered yet (runs/execution/controls.py); its `control`
events answer them. The HTTP view is runs/api/ingest.py; formats in docs/realtime.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs.auth.run_keys import ingest_token_derive
from runs.core import lifecycle
from runs.core.events import JOB_STATUS, event_ts, run_events_record
from runs.core.publish import run_summary_publish
from runs.core.stores import run_events_publish
from runs.errors import InvalidTransition, ServiceError
from runs.execution.controls import controls_ack, controls_pending
from runs.execution.liveness import has_placement_group
from runs.execution.outcome import event_outcome, run_job_finished
from runs.execution.preempt import preempt_resumed
from runs.execution.serving import serving_url_latest
from runs.metrics import spec as metric
from runs.metrics.record import Batch
from runs.models import FINISHED_STATUSES, Run, RunEvent, RunStatus, Slot
from runs.scheduling import enqueue
from runs.scheduling.progress import progress_fold
from runs.slots import store as slot_store
from runs.summary_types import RunSummary, is_summary_type
from runs.telemetry.ingest_validate import ingest_batch_validate
from runs.telemetry.prometheus.run_hist import hist_fold
from runs.telemetry.retention import events_keep
from runs.telemetry.samples import samples_record
from runs.webhooks.emit import ingest_emit
from trainer.events import ControlCommand, IngestReply

# Run.pending_reason of a `starting` run whose job waits for its placement group (its `resources` event
# `waiting`), and of one whose group is ready while its processes start (`placed`).
WAITING_FOR_RESOURCES = "waiting_for_resources"
STARTING_PROCESSES = "starting_processes"


class IngestUnauthorized(ServiceError):
    """Missing or wrong per-run token, or no such run: one answer for both, so run ids cannot be probed."""

    status_code = 401

    def __init__(self) -> None:
        super().__init__("a valid per-run ingest token is required (Authorization: Bearer <token>)")


class AttemptReplaced(InvalidTransition):
    """The batch's attempt is not the run's current one any more (requeued or resumed while it was posted)."""


@dataclass(frozen=True)
class IngestResult:
    stored: int  # events stored by this post
    duplicates: int  # events of this post already stored by an earlier one
    last_seq: int  # the run's platform seq after this post
    status: str  # the run's status, so the job notices `stopping` (cancel requested)
    dropped: int = 0  # events of this post not stored by the run's event budget (runs/telemetry/retention.py)
    # staff commands not yet answered (runs/execution/controls.py)
    commands: list[ControlCommand] = field(default_factory=list)

    def as_dict(self) -> IngestReply:
        return IngestReply(
            stored=self.stored,
            duplicates=self.duplicates,
            last_seq=self.last_seq,
            status=self.status,
            dropped=self.dropped,
            commands=list(self.commands),
        )


def run_for_ingest(*, run_id: int, token: str | None) -> Run:
    """The run whose token this is, still accepting events: IngestUnauthorized (no such run, or not its current
    attempt's token: the same answer, after the same constant-time compare) / InvalidTransition (409: the run is
    finished, so its job should stop) otherwise. run_events_ingest checks status and attempt again under the
    run's row lock."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        ingest_token_derive(run_id=run_id, attempt=0, nonce="")  # the work of a compare: no timing difference
        raise IngestUnauthorized()
    if not token or not run.ingest_token_matches(token):  # constant time; a new attempt's token differs
        raise IngestUnauthorized()
    if run.status in FINISHED_STATUSES:
        raise InvalidTransition(f"run {run_id} is {run.status}; it accepts no more events", field="status")
    return run


def summary_fold(summary: RunSummary, events: list[RunEvent]) -> RunSummary:
    """The summary after `events` (in seq order): the latest data of each summarized type wins; train events
    also feed `progress`, the recent steps and evaluation time the finish ETA is built from
    (runs/scheduling/progress.py). Its shape: runs.summary_types.RunSummary."""
    folded = summary.copy()
    for event in events:
        etype = event.type
        if is_summary_type(etype):
            folded[etype] = event.data
        if event.type == "train":
            folded["progress"] = progress_fold(folded.get("progress"), train=event.data, ts=event.ts.timestamp())
        if event.type in ("train", "version"):
            folded["hist"] = hist_fold(folded.get("hist"), event.type, event.data)
        folded["last_event_at"] = event.ts.timestamp()
    return folded


def run_events_ingest(*, run: Run, payload: Any) -> IngestResult:
    """Store a validated batch from the run's current attempt; idempotent on the emitter's seq. Its `sample`
    events go to the samples table (runs/telemetry/samples.py), counted in `stored`/`duplicates` like events."""
    started = time.monotonic()
    items = ingest_batch_validate(payload)
    samples = [item for item in items if item["type"] == "sample"]
    items = [item for item in items if item["type"] != "sample"]
    source = f"attempt-{run.attempt}"
    now = timezone.now()
    with transaction.atomic():
        # The run row lock is held to the end of the transaction: the budget check, the stored seqs and the
        # summary fold of two concurrent posts cannot interleave, and status and attempt are read again under it
        # (run_for_ingest read them before: a requeue, resume or finish may have committed since).
        count, status_now, attempt = (
            Run.objects.select_for_update().values_list("last_seq", "status", "attempt").get(pk=run.pk)
        )
        _still_current(run, status=status_now, attempt=attempt)
        kept, dropped = events_keep(stored=count, items=items)
        stored = run_events_record(run=run, source=source, events=kept)
        new_samples = samples_record(run=run, source=source, items=samples)
        ingest_emit(run=run, stored=stored)  # webhook events and metric rules, committed with the batch
        run_events_publish(stored)
        locked = Run.objects.select_for_update().only("summary", "status", "last_seq").get(pk=run.pk)
        fields: dict[str, Any] = {"heartbeat_at": now}
        serving_url = serving_url_latest(items)
        if serving_url is not None:  # where the proxy forwards to, "" once the job's server is going
            fields["serving_url"] = serving_url  # (runs/execution/serving.py)
        folded = _fold_order(items, stored, dropped)
        if folded:
            fields["summary"] = summary_fold(locked.summary or RunSummary(), folded)
        Run.objects.filter(pk=run.pk).update(**fields)
        status, last_seq = locked.status, locked.last_seq
        if folded:
            run_summary_publish(run_id=run.pk)
    _ingest_record(stored, dropped=len(dropped), now=now.timestamp(), started=started)
    controls_ack(run_id=run.pk, stored=stored)
    status = resources_apply(run=run, stored=stored, status=status)
    final = next((e for e in reversed(stored) if e.type == JOB_STATUS), None)
    if final is not None and status not in FINISHED_STATUSES:
        # After the commit above: finishing takes the grant lock, which is always taken before a run row lock.
        outcome = event_outcome(Run.objects.get(pk=run.pk), final.data)
        if outcome is not None:
            finished = run_job_finished(run=run, status=outcome[0], error=outcome[1])
            status, last_seq = finished.status, finished.last_seq
    return IngestResult(
        stored=len(stored) + new_samples,
        duplicates=len(kept) - len(stored) + len(samples) - new_samples,
        last_seq=last_seq,
        status=status,
        dropped=len(dropped),
        commands=controls_pending(run_id=run.pk) if status == RunStatus.RUNNING else [],
    )


def _still_current(run: Run, *, status: str, attempt: int) -> None:
    """409 (nothing stored: the transaction rolls back) when the run finished or moved to another attempt."""
    if attempt != run.attempt:
        raise AttemptReplaced(
            f"attempt {run.attempt} of run {run.pk} was replaced by attempt {attempt}; it accepts no more events",
            field="attempt",
        )
    if status in FINISHED_STATUSES:
        raise InvalidTransition(f"run {run.pk} is {status}; it accepts no more events", field="status")


def _ingest_record(stored: list[RunEvent], *, dropped: int, now: float, started: float) -> None:
    """Metrics of one post (after its commit): events stored by type, their lag, the post's duration."""
    batch = Batch()
    for event in stored:
        batch.add(metric.EVENTS_INGESTED, (event.type,))
    if dropped:
        batch.add(metric.EVENTS_DROPPED, (), dropped)
    batch.observe(metric.INGEST_LAG, (), [max(0.0, now - e.ts.timestamp()) for e in stored])
    batch.observe(metric.INGEST_DURATION, (), [time.monotonic() - started])
    batch.commit()


def resources_apply(*, run: Run, stored: list[RunEvent], status: str) -> str:
    """After a post is stored: what its `resources` events (or, for a run without a placement group, the post
    itself) mean for a `starting` run; returns the run's status after it. Runs after the post's commit, since
    moves take the grant lock, which is always taken before a run row lock."""
    if status != RunStatus.STARTING:
        return status
    if not has_placement_group(run):
        return _started(run, placement=None)  # the first accepted post of a job without a group
    event = next((e for e in reversed(stored) if e.type == "resources"), None)
    data = event.data if event is not None and isinstance(event.data, dict) else {}
    state = data.get("state")
    if state == "ready":
        nodes = data.get("nodes")
        return _started(run, placement=nodes if isinstance(nodes, list) else None)
    if state == "timeout":
        waited = data.get("waited_s")
        detail = str(data.get("detail") or "")
        reason = f"placement group not ready within {waited} s" if waited is not None else "placement timeout"
        enqueue.run_requeue(run=run, reason=f"{reason}{': ' + detail if detail else ''}")
        return Run.objects.values_list("status", flat=True).get(pk=run.pk)  # granted again at once, maybe
    if state in ("waiting", "placed"):
        _starting_reason(run, state, data)
    return status


def _starting_reason(run: Run, state: str, data: dict[str, Any]) -> None:
    """A `starting` run's pending reason from its job's `waiting` or `placed` event; `placed` also records where
    Ray placed the group (a node lost while the processes start then fails exactly its runs)."""
    if state == "waiting":
        reason = WAITING_FOR_RESOURCES
        detail = str(data.get("detail") or f"waiting for a placement group ({data.get('strategy') or 'PACK'})")
    else:
        reason = STARTING_PROCESSES
        detail = str(data.get("detail") or "placement group ready; starting the run's processes")
    nodes = _placement(run, data.get("nodes")) if state == "placed" else None
    placed = nodes is not None
    with transaction.atomic():
        if placed:
            slot_store.slots_lock()  # a slot's placement is what grants charge per node: changed under the lock
        moved = Run.objects.filter(pk=run.pk, status=RunStatus.STARTING).update(
            pending_reason=reason, pending_detail=detail[:300]
        )
        if moved and placed:
            Slot.objects.filter(run_id=run.pk).update(placement=nodes)


def _started(run: Run, *, placement: list[Any] | None) -> str:
    """starting -> running (one writer: runs.core.lifecycle), the pending reason cleared, the real placement kept."""
    with transaction.atomic():
        slot_store.slots_lock()
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status != RunStatus.STARTING:
            return locked.status
        lifecycle.run_status_change(run=locked, status=RunStatus.RUNNING)  # clears the pending reason too
        preempt_resumed(run=locked, now=timezone.now())  # a preempted run's next attempt: its `resumed` event
        nodes = _placement(locked, placement)
        if nodes is not None:
            Slot.objects.filter(run_id=run.pk).update(placement=nodes)
    return RunStatus.RUNNING


def _placement(run: Run, nodes: Any) -> list[str] | None:
    """A job's reported placement when it can stand for the granted one: a node id (string) for each of the
    run's bundles, in order. Else None, and the grant's placement stays: grants charge bundle i to node i, so a
    shorter list would leave bundles uncharged."""
    bundles = run.resources.get("bundles") if isinstance(run.resources, dict) else None
    if not isinstance(nodes, list) or not isinstance(bundles, list) or len(nodes) != len(bundles) or not nodes:
        return None
    return nodes if all(isinstance(n, str) and 0 < len(n) <= 128 for n in nodes) else None


def _fold_order(items: list[dict[str, Any]], stored: list[RunEvent], dropped: list[dict[str, Any]]) -> list[RunEvent]:
    """Stored rows and dropped events (unsaved rows) in posted order: a dropped event still updates the
    summary; duplicates of earlier posts do not."""
    rows = {row.source_seq: row for row in stored}
    dropped_ids = {id(item) for item in dropped}
    out: list[RunEvent] = []
    for item in items:
        if id(item) in dropped_ids:
            out.append(RunEvent(type=item["type"], data=item.get("data") or {}, ts=event_ts(item.get("ts"))))
        elif item.get("source_seq") in rows:
            out.append(rows.pop(item["source_seq"]))
    return out
