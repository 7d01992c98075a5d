"""The run comparison page (/compare/?runs=1,2,3&metric=reward_mean&x=step). Thin: it embeds the JSON of
GET /api/runs/compare/ (runs.telemetry.compare, same visibility rules) and compare.ts draws it; bad input is a 400 page
that names the parameter."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from runs.errors import InvalidInput
from runs.telemetry.compare import COMPARE_RUNS_MAX, compare_ids_parse, run_compare

ALIGNMENTS = ("step", "time")


@login_required
def compare(request: HttpRequest) -> HttpResponse:
    raw = request.GET.get("runs", "")
    # The form shows back only what an id list can hold (the error message quotes the offending part).
    shown = "".join(c for c in raw[:200] if c in "0123456789, ")
    context = {"nav": "compare", "runs_raw": shown, "runs_max": COMPARE_RUNS_MAX}
    if "runs" not in request.GET:  # the bare page: the form only
        return render(request, "frontend/compare.html", {**context, "empty": True})
    try:
        x = request.GET.get("x", "step")
        if x not in ALIGNMENTS:
            raise InvalidInput(f"expected one of {', '.join(ALIGNMENTS)}", field="x")
        run_ids = compare_ids_parse(raw)
    except InvalidInput as exc:
        return render(request, "frontend/compare.html", {**context, "error": str(exc)}, status=400)
    data = run_compare(user=request.user, run_ids=run_ids)
    return render(request, "frontend/compare.html", {**context, "compare_data": data})
