"""One visibility rule for runs (runs/core/visibility.py): the owner or staff; and nothing else in the code base
writes its own version of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import AnonymousUser

from runs.core.visibility import may_see, visible_runs
from tests.runs.test_services import submit

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_owner_and_staff_see_a_run_others_and_anonymous_do_not(user, other_user, staff, handoffs):
    mine, theirs = submit(user, origin="api"), submit(other_user, origin="api")
    assert may_see(user, mine.owner_id) and not may_see(user, theirs.owner_id)
    assert may_see(staff, mine.owner_id) and may_see(staff, theirs.owner_id)
    assert not may_see(AnonymousUser(), mine.owner_id) and not may_see(AnonymousUser(), None)
    assert set(visible_runs(user).values_list("pk", flat=True)) == {mine.pk}
    assert set(visible_runs(other_user).values_list("pk", flat=True)) == {theirs.pk}
    assert set(visible_runs(staff).values_list("pk", flat=True)) == {mine.pk, theirs.pk}
    assert not visible_runs(AnonymousUser()).exists()
    narrowed = visible_runs(user, visible_runs(staff).filter(pk=theirs.pk))
    assert not narrowed.exists()  # narrows the queryset it is given, never widens it


# The rule written out by hand: "staff or the owner" as an expression, or a filter on the owner next to a staff
# check. Only runs/core/visibility.py may hold it.
HAND_WRITTEN = re.compile(
    r"is_staff\s+or\s+[\w.]*owner"  # staff or the owner, as an expression
    r"|owner_id\s*==\s*[\w.]*user"  # the owner compared by hand
    r"|if not [\w.]*is_staff:\s*\n\s*\w+ = \w+\.filter\(owner"  # a queryset narrowed by hand
)


def test_no_module_writes_the_rule_itself():
    offenders = []
    for package in ("runs", "frontend", "config"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "visibility.py" or "migrations" in path.parts:
                continue
            if HAND_WRITTEN.search(path.read_text()):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
