"""Dashboard pages: queue board, run page and run submit form. Thin: each page embeds the same JSON the
REST API / websockets serve (runs.selectors, runs.telemetry.dashboard) and the browser code in frontend/static draws
it."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from runs import selectors
from runs.audit.query import last_actors
from runs.core.checkpoints import run_checkpoint_step
from runs.errors import InvalidInput, RunNotFound
from runs.execution.kinds import DEFAULT_KIND, kind_get
from runs.telemetry.dashboard import dashboard_snapshot

# Shown first on the submit form; every other schema field sits under "Advanced".
COMMON_FIELDS = (
    "task",
    "steps",
    "prompts_per_step",
    "group_size",
    "lr",
    "mode",
    "max_staleness",
    "num_engines",
    "num_workers",
    "checkpoint_every",
    "seed",
    "device",
)

LABELS = {
    "lr": "Learning rate",
    "kl_coef": "KL coefficient",
    "clip_eps": "PPO clip range",
    "ppo_epochs": "PPO epochs",
    "d_model": "Model width",
    "n_layer": "Layers",
    "n_head": "Attention heads",
    "max_staleness": "Max staleness",
}


@login_required
def board(request: HttpRequest) -> HttpResponse:
    """Queue board. The page carries the same {slots, queue, active} that /ws/dashboard/ sends on connect
    (one builder: runs.telemetry.dashboard), so the first paint needs no extra request."""
    snapshot, _seqs = dashboard_snapshot(user=request.user)
    return render(request, "frontend/board.html", {"board_data": snapshot, "nav": "board"})


@login_required
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    try:
        run = selectors.run_get(user=request.user, run_id=run_id)
    except RunNotFound as exc:
        raise Http404(str(exc)) from exc
    data = selectors.runs_json([run])[0]
    return render(
        request,
        "frontend/run.html",
        {
            "run": run,
            "run_data": data,
            "config_json": json.dumps(run.config, indent=2, sort_keys=True),
            # What "Resume from checkpoint step N" names; None: only "Start over from step 0" is offered.
            "checkpoint_step": run_checkpoint_step(run),
            "last_actors": last_actors([run.pk])[run.pk],  # who last cancelled / resumed it (the audit log)
            "nav": "run",
        },
    )


def schema_fields(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Form fields from a run kind's JSON schema: name, input type, default, help text and bounds."""
    fields = []
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type", "string")
        default = prop.get("default")
        field = {
            "name": name,
            "label": LABELS.get(name, name.replace("_", " ").capitalize()),
            "type": kind,
            "help": prop.get("description", ""),
            "enum": prop.get("enum"),
            "minimum": prop.get("minimum"),
            "maximum": prop.get("maximum"),
            "default": "" if default is None else (str(default).lower() if isinstance(default, bool) else default),
            "checked": bool(default) if kind == "boolean" else False,
            "step": "1" if kind == "integer" else "any",
            "common": name in COMMON_FIELDS,
        }
        fields.append(field)
    order = {n: i for i, n in enumerate(COMMON_FIELDS)}
    fields.sort(key=lambda f: (not f["common"], order.get(f["name"], 0)))
    return fields


@login_required
def run_submit_form(request: HttpRequest) -> HttpResponse:
    """Form for an interactive training run; the browser posts it to POST /api/runs/ (origin dashboard)."""
    kind = kind_get(DEFAULT_KIND)
    fields = schema_fields(kind.json_schema())
    try:
        resources: dict[str, Any] | None = kind.demand({})  # the defaults; the page updates it as the form changes
    except InvalidInput:
        resources = None
    return render(
        request,
        "frontend/submit.html",
        {
            "kind": kind,
            "common_fields": [f for f in fields if f["common"]],
            "advanced_fields": [f for f in fields if not f["common"]],
            "nav": "submit",
            "resources": resources,
        },
    )
