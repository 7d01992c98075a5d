"""The settings page's usage table (issue 26): CPU- and GPU-hours per user and per team over the last day and
week, clipped to each window, hostile names escaped, staff only."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.utils import timezone

from runs.models import Run, RunStatus
from runs.slots.usage import hours_by_owner

pytestmark = pytest.mark.django_db
HOSTILE = '<img src=x onerror="alert(1)">'


def ran(owner, *, began_h: float, ended_h: float | None, cpu: float, gpu: float = 0.0) -> Run:
    """A run that held its resources from `began_h` hours ago until `ended_h` hours ago (None: still running)."""
    now = timezone.now()
    return Run.objects.create(
        name="r",
        origin="api",
        run_class="app",
        kind="rl_train",
        owner=owner,
        status=RunStatus.RUNNING if ended_h is None else RunStatus.SUCCEEDED,
        granted_at=now - timedelta(hours=began_h),
        finished_at=None if ended_h is None else now - timedelta(hours=ended_h),
        resources={"total": {"CPU": cpu, "GPU": gpu, "memory": 0}},
    )


@pytest.fixture
def crowd(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user(HOSTILE)
    vision, nlp = Group.objects.create(name="vision"), Group.objects.create(name=f"nlp {HOSTILE}")
    alice.groups.add(vision)
    bob.groups.add(vision, nlp)
    ran(alice, began_h=2, ended_h=1, cpu=2, gpu=1)  # 1 h in the day
    ran(alice, began_h=30, ended_h=20, cpu=1)  # 4 h in the day (20-24 h ago), 10 h in the week
    ran(bob, began_h=0.5, ended_h=None, cpu=4)  # still going: 0.5 h
    ran(bob, began_h=24 * 9, ended_h=24 * 6, cpu=8)  # only its last day is in the week
    ran(bob, began_h=24 * 30, ended_h=24 * 29, cpu=100, gpu=8)  # before the week: nothing
    return alice, bob


def test_hours_are_clipped_to_each_window(crowd):
    alice, bob = crowd
    now = timezone.now()
    hours = hours_by_owner(now=now, windows={"day": 86_400, "week": 7 * 86_400})
    day, week = hours["day"], hours["week"]
    assert day[alice.pk] == pytest.approx((2 * 1 + 1 * 4, 1), abs=1e-3)
    assert week[alice.pk] == pytest.approx((2 * 1 + 1 * 10, 1), abs=1e-3)
    assert day[bob.pk] == pytest.approx((4 * 0.5, 0), abs=1e-3)
    assert week[bob.pk] == pytest.approx((4 * 0.5 + 8 * 24, 0), abs=1e-3)


def test_the_page_shows_users_and_teams_escaped_and_only_to_staff(crowd, django_user_model):
    alice, _ = crowd
    staff = django_user_model.objects.create_user("root", is_staff=True)
    plain = Client()
    plain.force_login(alice)
    assert plain.get("/settings/").status_code == 403
    client = Client()
    client.force_login(staff)
    html = client.get("/settings/").content.decode()
    users = html[html.index('data-testid="usage-users"') : html.index('data-testid="usage-teams"')]
    teams = html[html.index('data-testid="usage-teams"') :]
    assert HOSTILE not in html and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in users
    # Heaviest first by GPU-hours in the week: alice (1 GPU-h) before bob (0).
    assert users.index(">alice<") < users.index("&lt;img")
    assert cells(users, "alice") == pytest.approx([6, 1, 12, 1], abs=0.02)  # day CPU, GPU; week CPU, GPU
    assert cells(teams, "vision") == pytest.approx([8, 1, 206, 1], abs=0.02)  # alice and bob
    assert cells(teams, "nlp &lt;img") == pytest.approx([2, 0, 194, 0], abs=0.02)  # bob


def cells(table: str, name: str) -> list[float]:
    """The numbers in the row whose header starts with `name` (a run still going grows while the page renders)."""
    row = re.search(rf'<th scope="row">{re.escape(name)}[^<]*</th>(.*?)</tr>', table, re.S)
    assert row, name
    return [float(x) for x in re.findall(r"<td>([0-9.]+)</td>", row.group(1))]
