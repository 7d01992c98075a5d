"""`python -m client explain <id>` against a real HTTP server of the app (pytest-django's live_server, the test
database): a queued run's position, pending reason and the priority factors of GET /api/runs/<id>/priority/; a
run that holds a slot has no factors. The CLI runs in this process (client.cli.main), over httpx."""

from __future__ import annotations

import json

import pytest

from client import cli
from runs.auth.tokens import token_issue
from runs.execution.submit import run_submit
from runs.models import RunStatus
from tests.runs.helpers import TEST_KIND

pytestmark = pytest.mark.django_db(transaction=True)  # the server thread sees only committed rows


def explain(live_server, token: str, run_id: int, capsys, *, as_json: bool) -> str:
    args = ["--url", live_server.url, "--token", token, *(["--json"] if as_json else []), "explain", str(run_id)]
    assert cli.main(args) == 0
    return capsys.readouterr().out


def test_explain_gives_a_queued_runs_place_reason_and_priority_factors(live_server, user, handoffs, capsys):
    runs = [run_submit(owner=user, name=f"r{i}", origin="api", kind=TEST_KIND, config={}) for i in range(5)]
    held = runs[0]
    queued = next(r for r in runs if r.status == RunStatus.QUEUED)  # the first to wait: the slots are full
    assert held.status == RunStatus.STARTING
    token = token_issue(user)

    answer = json.loads(explain(live_server, token, queued.pk, capsys, as_json=True))
    assert answer["status"] == "queued" and answer["position"] == {"in_class": 1, "overall": 1}
    assert answer["pending_reason"] == "class_limit_reached"  # the app class holds its limit
    factors = answer["factors"]
    assert factors["run_class"] == "app" and factors["effective_priority"] >= factors["class_priority"]
    assert {"waited_seconds", "aging", "max_wait", "fair_share", "user_limit"} <= set(factors)

    text = explain(live_server, token, queued.pk, capsys, as_json=False)
    assert "pending_reason: class_limit_reached" in text and "priority class_priority: " in text

    running = json.loads(explain(live_server, token, held.pk, capsys, as_json=True))
    assert running["status"] == "starting" and running["factors"] is None and running["position"] is None
