"""Reads the dashboard needs on top of runs.selectors: the board's first-paint snapshot and sparkline history."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.db.models import F, Window
from django.db.models.functions import RowNumber

from runs import realtime, selectors
from runs.models import ACTIVE_STATUSES, Run, RunEvent, RunStatus


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


def board_queue(*, user: Any) -> list[dict[str, Any]]:
    """The queued runs this user may see, in grant order, with only what the board draws.

    The full run JSON (config, summary, timestamps) of a 1,000-run queue costs most of the page's bytes and
    server time; positions, pending reasons and ETAs still come from runs.selectors, the one place that
    computes them. The websocket snapshot that follows on connect carries the full JSON.
    """
    rows = list(
        selectors.run_list(user=user, status=RunStatus.QUEUED)
        .values_list("id", "name", "run_class", "created_at", "owner__username")
    )
    # runs_queue_info reads id, status and class: light instances instead of full rows.
    info = selectors.runs_queue_info(runs=[
        Run.from_db(None, ["id", "status", "run_class"], (pk, RunStatus.QUEUED, run_class))
        for pk, _name, run_class, _at, _owner in rows
    ])
    out = []
    for pk, name, run_class, created_at, owner in rows:
        q = info.get(pk)
        out.append({
            "id": pk, "name": name, "run_class": run_class, "status": RunStatus.QUEUED, "owner": owner,
            "created_at": created_at.isoformat(),
            "position": {"in_class": q.position_in_class, "overall": q.position_overall} if q else None,
            "pending_reason": q.pending_reason if q else None, "eta_seconds": q.eta_seconds if q else None,
        })
    out.sort(key=lambda r: ((r["position"] or {}).get("overall", 1 << 30), r["id"]))
    return out


def board_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The parts of a run summary a board row draws (gate state, weight version, sampler, reward, step)."""
    gate, version, train = summary.get("gate") or {}, summary.get("version") or {}, summary.get("train") or {}
    return {
        "gate": {"state": gate.get("state")}, "version": {"version": version.get("version")},
        "sampler": summary.get("sampler") or {},
        "train": {"reward_mean": train.get("reward_mean"), "step": train.get("step")},
    }


def board_snapshot(*, user: Any) -> dict[str, Any]:
    """{slots, queue, active} as /ws/dashboard/ sends it, with the compact queue above, plus reward histories
    of the active runs for their sparklines."""
    active_runs = list(selectors.run_list(user=user).filter(status__in=ACTIVE_STATUSES).order_by("id"))
    active = realtime.runs_payload(active_runs)
    histories = reward_histories(run_ids=[r.pk for r in active_runs])
    for run in active:
        run.pop("config", None)  # never shown on the board
        run["summary"] = board_summary(run.get("summary") or {})
        run["reward_history"] = histories.get(run["id"], [])
    return {"slots": selectors.slots_snapshot(), "queue": board_queue(user=user), "active": active}
