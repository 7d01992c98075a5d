"""The dashboard's reads, one builder each: the snapshot (the board page embeds it and /ws/dashboard/ sends it
on connect), the board row of a run, and the queue change a `slots` message carries. Formats: runs/messages.py
and docs/realtime.md.

A queue change costs the same whatever the queue length: the keys of the slots that joined or left, each
class's pending reason and the grant rate; the board moves the positions of the rows it has by those keys.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, cast

from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from runs import selectors
from runs.core.events import STATUS
from runs.messages import BoardRun, ClusterJson, DashboardSnapshotMsg, QueueChange, QueueKey, RunJson
from runs.models import ACTIVE_STATUSES, ClusterStatus, Run, RunEvent, RunStatus, Slot
from runs.scheduling.finishes import active_finishes, typical_run_seconds
from runs.scheduling.queue import grant_rate_per_second, runs_queue_info
from runs.slots import store
from runs.slots.grant import HIGHER_PRIORITY_WAITING, blocking_reason
from runs.slots.policy import CLASSES
from runs.slots.resources import free_after, total
from runs.summary_types import BoardGate, BoardSampler, BoardSummary, BoardTrain, BoardVersion
from trainer.event_fields import NAME_MAX

REWARD_HISTORY = 40  # train-event rewards an active row's sparkline starts with


def board_summary(summary: Mapping[str, object]) -> BoardSummary:
    """The parts of a run summary a board row draws (gate state, weight version, sampler, reward, step): declared
    fields only (runs.summary_types.BoardSummary), each of its declared type or null, whatever a job posted."""
    gate, version, train = (_part(summary, k) for k in ("gate", "version", "train"))
    sampler = _part(summary, "sampler")
    return BoardSummary(
        gate=BoardGate(state=_name(gate.get("state"))),
        version=BoardVersion(version=_int(version.get("version"))),
        sampler=cast(BoardSampler, {k: _int(sampler[k]) for k in BoardSampler.__annotations__ if k in sampler}),
        train=BoardTrain(reward_mean=_float(train.get("reward_mean")), step=_int(train.get("step"))),
    )


def _part(summary: Mapping[str, object], key: str) -> dict[str, Any]:
    value = summary.get(key)
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _name(value: Any) -> str | None:
    """A name of at most NAME_MAX characters; anything else is shown as unknown (null)."""
    return value if isinstance(value, str) and len(value) <= NAME_MAX else None


def board_run(run: RunJson, requested_at: float | None = None) -> BoardRun:
    """A board row from the run JSON: no config, the summary cut to what a row draws, the slot's
    `requested_at` (seconds) when the run waits."""
    row: dict[str, Any] = {
        k: v for k, v in run.items() if k not in ("config", "auto_resume", "time_limit_seconds", "resources")
    }
    row["summary"] = board_summary(run.get("summary") or {})
    row["requested_at"] = requested_at
    return BoardRun(**row)  # type: ignore[typeddict-item]


def board_runs(run_ids: Iterable[int]) -> list[tuple[BoardRun, int, int]]:
    """(board row, owner id, last seq) of each run, read now (a constant number of queries)."""
    runs = list(Run.objects.select_related("owner").filter(pk__in=list(run_ids)))
    waiting = dict(
        Slot.objects.filter(run_id__in=[r.pk for r in runs if r.status == RunStatus.QUEUED]).values_list(
            "run_id", "requested_at"
        )
    )
    return [
        (board_run(payload, _seconds(waiting.get(run.pk))), run.owner_id, run.last_seq)
        for run, payload in zip(runs, selectors.runs_json(runs))
    ]


def reward_histories(*, run_ids: Iterable[int], limit: int = REWARD_HISTORY) -> dict[int, list[float]]:
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


def queue_rows(*, user: Any) -> tuple[list[BoardRun], dict[int, int]]:
    """The queued runs this user may see, in grant order, with only what the board draws, and their last seqs.

    Positions, pending reasons and ETAs come from runs.selectors, the one place that computes them; rows are
    read as values (the full run of a 3,000-run queue costs most of the page's bytes and server time)."""
    rows = list(
        selectors.run_list(user=user, status=RunStatus.QUEUED).values_list(
            "id",
            "name",
            "origin",
            "run_class",
            "kind",
            "created_at",
            "owner__username",
            "last_seq",
            "slot__requested_at",
            "slot__demand",
            "slot__strategy",
        )
    )
    # runs_queue_info reads id, class, status and the demand: light instances instead of full rows (from_db
    # takes the values in the model's field order); the demand comes from the slot (same bundles, fewer bytes).
    info = runs_queue_info(
        runs=[
            Run.from_db(
                None,
                ["id", "run_class", "status", "resources"],
                (row[0], row[3], RunStatus.QUEUED, {"bundles": row[9] or [], "strategy": row[10]}),
            )
            for row in rows
        ]
    )
    out: list[BoardRun] = []
    for pk, name, origin, run_class, kind, created_at, owner, _seq, requested_at, _demand, _strategy in rows:
        q = info.get(pk)
        out.append(
            BoardRun(
                id=pk,
                name=name,
                origin=origin,
                run_class=run_class,
                kind=kind,
                status=RunStatus.QUEUED,
                owner=owner,
                created_at=selectors.iso(created_at) or "",
                requested_at=_seconds(requested_at),
                position={"in_class": q.position_in_class, "overall": q.position_overall} if q else None,
                pending_reason=q.pending_reason if q else None,
                pending_detail=q.pending_detail if q else None,
                eta_seconds=q.eta_seconds if q else None,
            )
        )
    out.sort(key=lambda r: (r["position"]["overall"] if r["position"] else 1 << 30, r["id"]))
    return out, {row[0]: row[7] for row in rows}


def dashboard_snapshot(*, user: Any) -> tuple[DashboardSnapshotMsg, dict[int, int]]:
    """{type: snapshot, slots, queue, active} as this user may see them (own runs; staff: all), and each
    shown run's last seq (consumers drop run updates older than what the snapshot showed)."""
    active_runs = list(selectors.run_list(user=user).filter(status__in=ACTIVE_STATUSES).order_by("id"))
    histories = reward_histories(run_ids=[r.pk for r in active_runs])
    active = []
    for payload in selectors.runs_json(active_runs):
        row = board_run(payload)
        row["reward_history"] = histories.get(payload["id"], [])
        active.append(row)
    queue, seqs = queue_rows(user=user)
    seqs.update({run.pk: run.last_seq for run in active_runs})
    snapshot = DashboardSnapshotMsg(
        type="snapshot", slots=selectors.slots_snapshot(), cluster=cluster_snapshot(), queue=queue, active=active
    )
    return snapshot, seqs


def cluster_snapshot() -> ClusterJson:
    """The cluster as admission sees it: reachable (the last read of Ray worked), alive nodes, their total and
    what the held runs leave free (Ray JSON units). Read from ClusterNode/ClusterStatus, written by the tick."""
    status = ClusterStatus.objects.order_by("pk").first()
    capacity = store.capacity_load()
    running = store.held_load()
    free = free_after(capacity, [(h.demand, h.placement) for h in running])
    return ClusterJson(
        reachable=bool(status and status.reachable),
        nodes=len(capacity),
        total=total(list(capacity.values())).to_json(),
        free=total(list(free.values())).to_json(),
    )


def queue_change(*, joined: Iterable[tuple[int, float]], left: Iterable[tuple[int, float]]) -> QueueChange:
    """The keys of the runs that joined and left the waiting line ((run id, commit time) pairs), the reasons
    per class, the grant rate, and the held runs' predicted finishes with a typical run's duration (the board
    recomputes queue ETAs from them as runs/scheduling/queue.py does)."""
    joined, left = list(joined), list(left)
    keys = queue_keys({r for r, _ in joined} | {r for r, _ in left})
    policy = store.policy_load()
    held = store.held_counts()
    reasons = {k: blocking_reason(policy, held, k) or HIGHER_PRIORITY_WAITING for k in CLASSES}
    now = timezone.now()

    def stamped(moves: list[tuple[int, float]]) -> list[QueueKey]:
        return [QueueKey(run_class=keys[r][0], requested_at=keys[r][1], at=at) for r, at in moves if r in keys]

    return QueueChange(
        joined=stamped(joined),
        left=stamped(left),
        reasons=reasons,
        rate=grant_rate_per_second(now=now),
        finishes=sorted(active_finishes(now=now).values()),
        run_seconds=typical_run_seconds(now=now),
    )


def queue_keys(run_ids: set[int]) -> dict[int, tuple[str, float]]:
    """Each run's place in grant order: its slot's class and request time; for a slot already released (a
    cancelled queued run) the run's class and the time of its latest `queued` status event, which is when
    its slot was requested. At most two queries, whatever the queue length."""
    if not run_ids:
        return {}
    out = {
        run_id: (run_class, _seconds(at) or 0.0)
        for run_id, run_class, at in Slot.objects.filter(run_id__in=run_ids).values_list(
            "run_id", "run_class", "requested_at"
        )
    }
    missing = run_ids - out.keys()
    if missing:
        rows = (
            RunEvent.objects.filter(run_id__in=missing, type=STATUS, data__status=RunStatus.QUEUED)
            .order_by("run_id", "seq")
            .values_list("run_id", "run__run_class", "ts")
        )
        for run_id, run_class, ts in rows:  # the latest one of each run wins
            out[run_id] = (run_class, ts.timestamp())
    return out


def _seconds(value: Any) -> float | None:
    return value.timestamp() if value is not None else None
