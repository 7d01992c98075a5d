"""Issue 27, item 4: a scripted sequence of exactly 50 mutations over HTTP (submits, cancels, resumes, settings
changes, schedule changes, token create/revoke, gate resets) by several users, a token user and the platform
yields exactly 50 audit rows, in order, with the right actors and actions. Runs on PostgreSQL and on SQLite
(DATABASE_URL=sqlite:///...), through the real API, the real token authentication and the scheduler's writer."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from runs.audit.models import AuditEntry
from runs.core.lifecycle import run_transition
from runs.execution.schedules import schedules_submit_due
from runs.models import Run, RunStatus, Schedule
from tests.api.test_gate_reset import gate, ingest
from tests.runs.helpers import TEST_JOB_KIND, TEST_KIND

pytestmark = pytest.mark.django_db


class Script:
    """Each call asserts its answer and appends the audit row it must have written: (actor, action)."""

    def __init__(self) -> None:
        self.expected: list[tuple[str, str]] = []

    def call(self, client: APIClient, method: str, url: str, body: dict | None, status: int, row: tuple[str, str]):
        answer = getattr(client, method)(url, body, format="json")
        assert answer.status_code == status, (method, url, answer.status_code, answer.content)
        self.expected.append(row)
        return answer.json() if answer.content else None


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def token_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}", HTTP_X_REQUEST_ID="seq-req-1")
    return client


def test_fifty_mutations_write_fifty_rows_with_their_actors(user, other_user, staff, handoffs) -> None:
    s = Script()
    alice, bob, root = user, other_user, staff
    anon = APIClient()
    # Tokens (2): alice and bob sign in.
    alice_key = s.call(
        anon, "post", "/api/auth/token/", {"username": "alice", "password": "pw-alice"}, 200, ("alice", "token.create")
    )["token"]
    bob_key = s.call(
        anon, "post", "/api/auth/token/", {"username": "bob", "password": "pw-bob"}, 200, ("bob", "token.create")
    )["token"]
    a, b, r = token_client(alice_key), session(bob), session(root)
    job = {"name": "job", "kind": TEST_JOB_KIND, "config": {}}
    # Gate resets (2 submits + 2 resets): root's two runs are granted (max_total 4), run, and poison their gates.
    gated = [s.call(r, "post", "/api/runs/", job, 201, ("root", "run.submit"))["id"] for _ in range(2)]
    for run_id in gated:
        run = run_transition(run=Run.objects.get(pk=run_id), status=RunStatus.RUNNING)
        ingest(run, [{"seq": 1, **gate("poisoned")}])
        s.call(
            r, "post", f"/api/runs/{run_id}/gate-reset/", {"reason": "engine restarted"}, 202, ("root", "gate.reset")
        )
    # Submits (10): alice by token, bob by session. Two more are granted (starting); the rest wait, queued.
    plain = {"name": "r", "kind": TEST_KIND, "config": {"steps": 1}}
    mine = [s.call(a, "post", "/api/runs/", plain, 201, ("alice", "run.submit"))["id"] for _ in range(6)]
    bobs = [s.call(b, "post", "/api/runs/", plain, 201, ("bob", "run.submit"))["id"] for _ in range(4)]
    # Cancels (7): alice 4 (her first two are starting: they move to stopping), bob 2, root 1 of bob's.
    for run_id in mine[:4]:
        s.call(a, "post", f"/api/runs/{run_id}/cancel/", None, 200, ("alice", "run.cancel"))
    for run_id in bobs[1:3]:
        s.call(b, "post", f"/api/runs/{run_id}/cancel/", None, 200, ("bob", "run.cancel"))
    s.call(r, "post", f"/api/runs/{bobs[3]}/cancel/", None, 200, ("root", "run.cancel"))
    # A repeated cancel of a stopping run changes nothing and writes nothing (not counted).
    assert Run.objects.get(pk=mine[0]).status == RunStatus.STOPPING
    assert a.post(f"/api/runs/{mine[0]}/cancel/", format="json").status_code == 200
    # Resumes (3): alice 2 of her cancelled runs, root 1 of bob's.
    for run_id in mine[2:4]:
        s.call(a, "post", f"/api/runs/{run_id}/resume/", {"from_scratch": True}, 200, ("alice", "run.resume"))
    s.call(r, "post", f"/api/runs/{bobs[3]}/resume/", {"from_scratch": True}, 200, ("root", "run.resume"))
    # Schedules (9): root creates 4, changes 3, deletes 2; two of them fire (platform, 2 submits).
    cron = {"cron": "0 3 * * *", "kind": TEST_KIND, "config": {"steps": 1}}
    sched = [
        s.call(r, "post", "/api/schedules/", {"name": f"s{i}", **cron}, 201, ("root", "schedule.create"))["id"]
        for i in range(4)
    ]
    for schedule_id in sched[:3]:
        s.call(r, "patch", f"/api/schedules/{schedule_id}/", {"cron": "0 4 * * *"}, 200, ("root", "schedule.update"))
    for schedule_id in sched[2:]:
        s.call(r, "delete", f"/api/schedules/{schedule_id}/", None, 204, ("root", "schedule.delete"))
    Schedule.objects.filter(pk__in=sched[:2]).update(next_run_at=timezone.now() - timedelta(minutes=1))
    assert len(schedules_submit_due()) == 2
    s.expected += [("platform", "run.submit")] * 2
    # Settings (4): root changes the concurrency settings.
    for i in range(4):
        s.call(r, "patch", "/api/settings/concurrency/", {"max_total": 5 + i}, 200, ("root", "settings.concurrency"))
    # More submits and cancels (7) by alice's token and bob.
    extra = [s.call(a, "post", "/api/runs/", plain, 201, ("alice", "run.submit"))["id"] for _ in range(3)]
    extra += [s.call(b, "post", "/api/runs/", plain, 201, ("bob", "run.submit"))["id"] for _ in range(2)]
    s.call(a, "post", f"/api/runs/{extra[0]}/cancel/", None, 200, ("alice", "run.cancel"))
    s.call(b, "post", f"/api/runs/{extra[3]}/cancel/", None, 200, ("bob", "run.cancel"))
    # Token revocations (2): alice by her token (that token), bob by session (all his).
    s.call(a, "delete", "/api/auth/token/", None, 204, ("alice", "token.revoke"))
    s.call(b, "delete", "/api/auth/token/", None, 204, ("bob", "token.revoke"))

    assert token_client(bob_key).get("/api/runs/").status_code == 401  # a session's revoke took all of bob's
    assert len(s.expected) == 50
    rows = list(AuditEntry.objects.order_by("id"))
    assert [(row.actor_name, row.action) for row in rows] == s.expected
    ids = {"alice": alice.pk, "bob": bob.pk, "root": root.pk, "platform": None}
    assert all(row.actor_user_id == ids[row.actor_name] for row in rows)
    # alice's calls carried her token: its prefix (not the token) and her request id are on every one but the
    # sign-in that issued it.
    prefix = alice_key[:8]
    by_token = [row for row in rows if row.actor_name == "alice" and row.action != "token.create"]
    assert by_token and all(row.actor_token == prefix and row.request_id == "seq-req-1" for row in by_token)
    assert not any(alice_key in str(row.before) + str(row.after) + row.target_id for row in rows)
    assert all(row.actor_token == "" for row in rows if row.actor_name != "alice")
    # Targets and values: a cancel names the run and its status before and after.
    cancel = next(row for row in rows if row.action == "run.cancel" and row.target_id == str(mine[0]))
    assert (cancel.before, cancel.after) == ({"status": "starting"}, {"status": "stopping"})
    first_settings = next(row for row in rows if row.action == "settings.concurrency")
    assert first_settings.after["raw"]["max_total"] == 5
