"""The sample inspector page (/runs/<id>/samples/): the run's captured samples, filtered by the query string.
Thin: the page embeds the run's id and name; the browser reads GET /api/runs/<id>/samples/ (runs/api/samples.py)
with the same filters, so a filter's URL and a sample's URL (`?sample=<id>`) are stable."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from runs import selectors
from runs.errors import RunNotFound
from runs.telemetry.sample_query import FILTERS, ORDERINGS
from trainer.sample_schema import FINISH_REASONS


@login_required
def run_samples(request: HttpRequest, run_id: int) -> HttpResponse:
    try:
        run = selectors.run_get(user=request.user, run_id=run_id)
    except RunNotFound as exc:
        raise Http404(str(exc)) from exc
    page = {"id": run.pk, "name": run.name, "filters": list(FILTERS), "orderings": list(ORDERINGS)}
    return render(
        request,
        "frontend/samples.html",
        {"run": run, "page_data": page, "finish_reasons": sorted(FINISH_REASONS), "nav": "run"},
    )
