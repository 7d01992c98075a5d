"""Staff page for the concurrency settings (slot policy, per-user caps, run time limits): a plain HTML form
(works without JavaScript) over the same service as PUT /api/settings/concurrency/; blank fields mean "use the
default"."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from frontend.views.usage import usage_context
from runs import selectors
from runs.audit.record import actor_from_request
from runs.errors import InvalidInput
from runs.scheduling.concurrency import settings_update
from runs.slots import store
from runs.slots.policy import CLASS_KEYS, CLASSES, policy_defaults, policy_effective
from runs.slots.preempt_policy import PREEMPT_TOP_KEYS
from runs.slots.user_limits import LIMIT_KEYS, LIMIT_RULES, limits_effective

TOP_FIELDS = ("max_total", "interactive_reserve", *LIMIT_KEYS, "fair_share_half_life_seconds", *PREEMPT_TOP_KEYS)
# Per class, the fair-share, bounded-waiting and preemption options (docs/slots.md): numbers, and checkboxes.
FAIR_NUMBERS = ("max_running_per_user", "aging_per_hour", "aging_cap", "max_wait_seconds")
CHECKBOX_KEYS = ("fair_share", "preemptible", "preempts")
TEAMS_KEY = "team_quotas"  # a textarea per class: one "group name = slots" per line
NUMBER_KEYS = tuple(k for k in CLASS_KEYS if k not in (*CHECKBOX_KEYS, TEAMS_KEY))
TEAMS_HELP = "Write one team per line: group name = slots (a whole number), or leave blank for no quotas."
LIMIT_LABELS = {
    "max_queued_per_user": ("Queued runs per user", "A submit past it is refused (429)."),
    "max_running_per_user": ("Active runs per user", "Starting, running or stopping; checked when a run is submitted."),
    "default_time_limit_seconds": ("Default time limit (s)", "For runs submitted without one; at most the maximum."),
    "max_time_limit_seconds": ("Maximum time limit (s)", "Larger time_limit_seconds on submit is refused (400)."),
}


def _form_name(field: str | None) -> str:
    """Service field names (classes.app.limit) -> form input names (app_limit)."""
    if not field:
        return "__all__"
    parts = field.split(".")
    if parts[0] == "classes" and len(parts) == 3:
        return f"{parts[1]}_{parts[2]}"
    return parts[0] if parts[0] in TOP_FIELDS else "__all__"


def _initial(raw: dict[str, Any]) -> dict[str, str]:
    values = {k: str(raw[k]) for k in TOP_FIELDS if isinstance(raw.get(k), int)}
    for name, item in (raw.get("classes") or {}).items():
        for key in NUMBER_KEYS:
            if isinstance(item, dict) and isinstance(item.get(key), int) and not isinstance(item.get(key), bool):
                values[f"{name}_{key}"] = str(item[key])
        for key in CHECKBOX_KEYS:
            if isinstance(item, dict) and item.get(key) is True:
                values[f"{name}_{key}"] = "on"
        teams = item.get(TEAMS_KEY) if isinstance(item, dict) else None
        if isinstance(teams, dict):
            values[f"{name}_{TEAMS_KEY}"] = "\n".join(f"{group} = {slots}" for group, slots in sorted(teams.items()))
    return values


def _teams(text: str) -> dict[str, int] | None:
    """The team quotas textarea -> {group name: slots}; None when a line is not "name = whole number". The name is
    everything before the last "=", so a group name may itself contain "=" (a newline it cannot: edit it by API)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, slots = line.rpartition("=")
        if not sep or not name.strip() or not slots.strip().isdigit():
            return None
        out[name.strip()] = int(slots.strip())
    return out


def _parse(post: Any) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """Form -> (changes for settings_update, submitted values to redisplay, per-field errors)."""
    changes: dict[str, Any] = {"classes": {}}
    values: dict[str, str] = {}
    errors: dict[str, str] = {}
    class_fields = {f"{c}_{k}": (c, k) for c in CLASSES for k in NUMBER_KEYS}
    for c in CLASSES:  # a checkbox: sent only when ticked
        for key in CHECKBOX_KEYS:
            if post.get(f"{c}_{key}") == "on":
                values[f"{c}_{key}"] = "on"
                changes["classes"].setdefault(c, {})[key] = True
    for c in CLASSES:
        text = post.get(f"{c}_{TEAMS_KEY}") or ""
        values[f"{c}_{TEAMS_KEY}"] = text.strip()
        teams = _teams(text)
        if teams is None:
            errors[f"{c}_{TEAMS_KEY}"] = TEAMS_HELP
        elif teams:
            changes["classes"].setdefault(c, {})[TEAMS_KEY] = teams
    for name in [*TOP_FIELDS, *class_fields]:
        text = (post.get(name) or "").strip()
        values[name] = text
        if text == "":
            continue  # blank: not stored, the default applies
        try:
            number = int(text)
        except ValueError:
            errors[name] = "Enter a whole number, or leave blank for the default."
            continue
        if name in TOP_FIELDS:
            changes[name] = number
        else:
            run_class, key = class_fields[name]
            changes["classes"].setdefault(run_class, {})[key] = number
    return changes, values, errors


@login_required
def concurrency_settings(request: HttpRequest) -> HttpResponse:
    if not request.user.is_staff:
        raise PermissionDenied("Only staff can change concurrency settings.")
    status = 200
    errors: dict[str, str] = {}
    if request.method == "POST":
        changes, values, errors = _parse(request.POST)
        weights = store.policy_stored_raw().get("user_weights")
        if isinstance(weights, dict):
            changes["user_weights"] = weights  # set through the API only: a save of this form keeps them
        if not errors:
            try:
                settings_update(changes=changes, partial=False, by=request.user, actor=actor_from_request(request))
            except InvalidInput as exc:
                errors[_form_name(exc.field)] = exc.message if _form_name(exc.field) != "__all__" else str(exc)
        if not errors:
            messages.success(request, "Concurrency settings saved; every process applies them within seconds.")
            return redirect("settings")
        status = 400
    else:
        values = _initial(store.policy_stored_raw())
    raw = store.policy_stored_raw()
    effective = policy_effective(raw, default_max_total=django_settings.SLOTS_DEFAULT_MAX_TOTAL)
    defaults = policy_defaults(effective.max_total)
    snapshot = selectors.slots_snapshot()
    rows = [
        {
            "name": c,
            "limit_field": f"{c}_limit",
            "priority_field": f"{c}_priority",
            "gpu_field": f"{c}_gpu_limit",
            "gpu_limit": values.get(f"{c}_gpu_limit", ""),
            "gpu_error": errors.get(f"{c}_gpu_limit"),
            "limit": values.get(f"{c}_limit", ""),
            "priority": values.get(f"{c}_priority", ""),
            "limit_error": errors.get(f"{c}_limit"),
            "priority_error": errors.get(f"{c}_priority"),
            "effective": effective.classes[c],
            "default_limit": policy_defaults(
                effective.max_total,
                raw.get("interactive_reserve") if isinstance(raw.get("interactive_reserve"), int) else None,
            )
            .classes[c]
            .limit,
            "default_priority": defaults.classes[c].priority,
            "usage": snapshot["classes"][c],
            "fair_share": values.get(f"{c}_fair_share") == "on",
            "fair": [
                {"key": k, "field": f"{c}_{k}", "value": values.get(f"{c}_{k}", ""), "error": errors.get(f"{c}_{k}")}
                for k in FAIR_NUMBERS
            ],
            "fair_effective": effective.fairness.of(c),
            "teams": values.get(f"{c}_{TEAMS_KEY}", ""),
            "teams_error": errors.get(f"{c}_{TEAMS_KEY}"),
            "borrow": values.get(f"{c}_team_borrowing_limit", ""),
            "borrow_error": errors.get(f"{c}_team_borrowing_limit"),
            "quotas_effective": effective.quotas.of(c),
            "preemptible": values.get(f"{c}_preemptible") == "on",
            "preempts": values.get(f"{c}_preempts") == "on",
        }
        for c in CLASSES
    ]
    in_effect = limits_effective(raw).to_dict()
    limit_rows = [
        {
            "name": k,
            "label": LIMIT_LABELS[k][0],
            "help": LIMIT_LABELS[k][1],
            "low": LIMIT_RULES[k][0],
            "high": LIMIT_RULES[k][1],
            "default": LIMIT_RULES[k][2],
            "value": values.get(k, ""),
            "error": errors.get(k),
            "effective": in_effect[k],
        }
        for k in LIMIT_KEYS
    ]
    context = {
        "limit_rows": limit_rows,
        "values": values,
        "errors": errors,
        "form_error": errors.get("__all__"),
        "rows": rows,
        "effective": effective,
        "default_max_total": django_settings.SLOTS_DEFAULT_MAX_TOTAL,
        "default_reserve": max(1, effective.max_total // 4),
        "total": snapshot["total"],
        "fairness": effective.fairness,
        "usage": usage_context(timezone.now(), effective.fairness),
        "preemption": effective.preemption,
    }
    return render(request, "frontend/settings.html", context, status=status)
