"""A run's JSON as every run endpoint answers it (RunSerializer with the queue's view of the runs)."""

from __future__ import annotations

from typing import Any, cast

from rest_framework.request import Request

from runs.api import serializers as s
from runs.audit.query import last_actors
from runs.models import Run
from runs.scheduling.queue import runs_queue_info


def runs_json(runs: list[Run], request: Request) -> list[dict[str, Any]]:
    info = runs_queue_info(runs=runs)
    context = {"request": request, "queue_info": info, "paces": {}}  # pace factors: read once per kind
    data = cast(list[dict[str, Any]], s.RunSerializer(runs, many=True, context=context).data)
    # many=True builds a ListSerializer, whose .data is a ReturnList (the stubs type it as the child's ReturnDict).
    # Who last cancelled and resumed each run: from the audit log (runs/audit/query.py), one query for the page;
    # only here, not in the websocket frames, which are built far more often.
    actors = last_actors(run.pk for run in runs)
    for row in data:
        row.update(actors[row["id"]])
    return data


def run_json(run: Run, request: Request) -> dict[str, Any]:
    return runs_json([run], request)[0]
