"""Staff page of the audit log: the rows of GET /api/audit/ with the same filters (runs.audit.query), newest
first, 50 a page. Server-rendered; every value goes through the template's autoescaping."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from runs.audit.models import Action
from runs.audit.query import FILTERS, audit_list, audit_row_json
from runs.errors import InvalidInput
from runs.models import Run

PAGE_SIZE = 50


@login_required
def audit_log(request: HttpRequest) -> HttpResponse:
    if not request.user.is_staff:
        raise PermissionDenied("staff only")
    params = {name: request.GET[name] for name in FILTERS if request.GET.get(name)}
    error, rows = None, []
    page = None
    try:
        page = Paginator(audit_list(params), PAGE_SIZE).get_page(request.GET.get("page"))
    except InvalidInput as exc:
        error = str(exc)
    if page is not None:
        run_ids = [int(r.target_id) for r in page if r.target_type == "run" and r.target_id.isdigit()]
        names = dict(Run.objects.filter(pk__in=run_ids).values_list("pk", "name"))
        for row in page:
            data = audit_row_json(row)
            data["run_name"] = names.get(int(row.target_id)) if row.target_type == "run" else None
            data["before"] = json.dumps(row.before, sort_keys=True) if row.before is not None else ""
            data["after"] = json.dumps(row.after, sort_keys=True) if row.after is not None else ""
            rows.append(data)
    status = 400 if error else 200
    context = {"rows": rows, "page": page, "filters": params, "error": error, "actions": Action.values, "nav": "audit"}
    return render(request, "frontend/audit.html", context, status=status)
