"""The settings form's team quotas (issue 26): staff edit each class's quotas as "group name = slots" lines and its
borrowing limit; the stored mapping round-trips, bad lines and unknown groups are errors beside the field, and
hostile group names are escaped wherever the page shows them."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from runs.scheduling.concurrency import settings_update
from runs.slots import store
from tests.api.test_pages import field_error, logged_in

pytestmark = pytest.mark.django_db
HOSTILE = '<script>alert("x")</script> = & "quoted"'


def test_team_quotas_round_trip_with_hostile_group_names(staff):
    Group.objects.create(name=HOSTILE)
    Group.objects.create(name="red")
    client = logged_in(staff)
    form = {"max_total": "4", "app_team_quotas": f"{HOSTILE} = 2\nred=1\n\n", "app_team_borrowing_limit": "1"}
    assert client.post("/settings/", form).status_code == 302
    assert store.policy_stored_raw()["classes"] == {
        "app": {"team_quotas": {HOSTILE: 2, "red": 1}, "team_borrowing_limit": 1}
    }
    html = client.get("/settings/").content.decode()
    assert "<script>alert" not in html and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; = &amp;" in html
    assert (
        'id="app_team_borrowing_limit" name="app_team_borrowing_limit" inputmode="numeric" size="5" value="1"' in html
    )
    assert "red: 1; borrowing up to 1" in html  # in effect, sorted by name after the hostile one
    assert client.post("/settings/", {"max_total": "4"}).status_code == 302  # blank: no quotas again
    assert store.policy_stored_raw()["classes"] == {}


@pytest.mark.parametrize(
    "form,fragment",
    [
        ({"app_team_quotas": "red: 2"}, "one team per line: group name = slots"),
        ({"app_team_quotas": "red = two"}, "one team per line: group name = slots"),
        ({"app_team_quotas": " = 2"}, "one team per line: group name = slots"),
        ({"app_team_quotas": "nobody = 1"}, "no such group: &#x27;nobody&#x27;"),
        ({"app_limit": "2", "app_team_quotas": "red = 2\nblue = 1"}, "more than the class limit 2"),
        ({"app_team_quotas": "red = 1001"}, "must be an integer from 0 to 1000"),
    ],
)
def test_bad_team_quotas_are_errors_beside_the_field(staff, form, fragment):
    Group.objects.create(name="red"), Group.objects.create(name="blue")
    answer = logged_in(staff).post("/settings/", {"max_total": "4", **form})
    assert answer.status_code == 400
    assert fragment in field_error(answer.content.decode(), "app_team_quotas")
    assert store.policy_stored_raw() == {}


def test_quotas_set_by_api_show_in_the_form(staff):
    Group.objects.create(name="red")
    settings_update(changes={"classes": {"schedule": {"team_quotas": {"red": 1}}}}, partial=True, by=None)
    html = logged_in(staff).get("/settings/").content.decode()
    assert (
        '<textarea id="schedule_team_quotas" name="schedule_team_quotas" rows="2" cols="28" placeholder="none">red = 1'
        in html
    )
    assert "red: 1; borrowing no bound" in html
