"""GET /api/runs/compare/ and the /compare/ page: ids validated (400 naming `runs`), only visible runs, train
metrics downsampled per run, config diff of the differing keys only (runs/telemetry/compare.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runs.core.events import run_events_record
from runs.errors import InvalidInput
from runs.models import Run
from runs.telemetry.compare import compare_ids_parse, config_diff, config_flatten, run_compare
from tests.api.clients import client_for

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def make_run(owner, name: str = "r", config: dict | None = None, steps: int = 0) -> Run:
    run = Run.objects.create(
        name=name, origin="api", run_class="app", kind="rl_train", owner=owner, config=config or {}, started_at=T0
    )
    events = [
        {"type": "train", "ts": (T0 + timedelta(seconds=2 * s)).timestamp(), "data": train(s)}
        for s in range(1, steps + 1)
    ]
    run_events_record(run=run, source="attempt-1", events=[{"type": "log", "data": {"message": "hi"}}, *events])
    return run


def train(step: int) -> dict:
    h = {"reward": {"edges": [0.0, 0.5, 1.0], "counts": [3, 5]}}
    return {"step": step, "reward_mean": step / 10, "loss": 1.0, "ok": True, "group_ids": [1, 2], "histograms": h}


# --- pure parts ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw,ids", [("1,2,3", [1, 2, 3]), (" 3 , 1,3", [3, 1]), ("7", [7])])
def test_ids_parse(raw, ids):
    assert compare_ids_parse(raw) == ids


@pytest.mark.parametrize(
    "raw,message",
    [
        (None, "1 to 10"),
        ("", "1 to 10"),
        (",".join(str(i) for i in range(1, 12)), "at most 10"),
        ("1,two", "'two'"),
        ("1,-2", "'-2'"),
        ("0", "'0'"),
        ("1,,2", "''"),
        ("²", "'²'"),
        ("1" * 19, "positive integers"),
    ],
)
def test_ids_parse_refuses_naming_runs(raw, message):
    with pytest.raises(InvalidInput) as err:
        compare_ids_parse(raw)
    assert err.value.field == "runs" and message in err.value.message


def test_config_flatten_and_diff_lists_only_differing_keys():
    a = {"lr": 0.001, "steps": 10, "model": {"d": 64, "layers": 2}, "tags": ["x"], "flag": True, "empty": {}}
    b = {"lr": 0.002, "steps": 10, "model": {"d": 64, "layers": 4}, "tags": ["x"], "flag": 1, "empty": {}}
    c = {"lr": 0.001, "steps": 10, "model": {"d": 64, "layers": 2}, "tags": ["x"], "flag": True, "extra": None}
    assert config_flatten(a)["model.layers"] == 2 and config_flatten(a)["empty"] == {}
    rows = {r["key"]: r for r in config_diff([a, b, c])}
    assert sorted(rows) == ["empty", "extra", "flag", "lr", "model.layers"]
    assert rows["lr"]["values"] == [0.001, 0.002, 0.001]
    assert rows["extra"] == {"key": "extra", "values": [None, None, None], "missing": [True, True, False]}
    assert rows["flag"]["values"] == [True, 1, True]  # `true` and `1` are different configs
    assert config_diff([a]) == [] and config_diff([a, dict(a)]) == []


# --- against the database ------------------------------------------------------------------------------

pytestmark_db = pytest.mark.django_db


@pytestmark_db
def test_compare_returns_metrics_columns_and_config_diff(user):
    one = make_run(user, "one", {"lr": 0.1, "steps": 3}, steps=3)
    two = make_run(user, "two", {"lr": 0.2, "steps": 3}, steps=2)
    body = client_for(user).get("/api/runs/compare/", {"runs": f"{two.pk},{one.pk}"}).json()
    assert [r["id"] for r in body["runs"]] == [two.pk, one.pk] and body["not_found"] == []
    first = body["runs"][1]
    assert first["step"] == [1, 2, 3] and first["elapsed"] == [2.0, 4.0, 6.0] and first["steps"] == 3
    assert first["metrics"] == {"reward_mean": [0.1, 0.2, 0.3], "loss": [1.0, 1.0, 1.0]}  # numbers only
    assert body["metrics"] == ["loss", "reward_mean"]
    assert body["config_diff"] == [{"key": "lr", "values": [0.2, 0.1], "missing": [False, False]}]


@pytestmark_db
def test_compare_downsamples_keeping_the_last_step(user):
    run = make_run(user, steps=25)
    col = run_compare(user=user, run_ids=[run.pk], points=10)["runs"][0]
    assert col["stride"] == 3 and col["steps"] == 25
    assert col["step"] == [1, 4, 7, 10, 13, 16, 19, 22, 25]
    assert len(col["metrics"]["reward_mean"]) == len(col["step"])


@pytestmark_db
def test_runs_the_user_cannot_see_are_not_found_like_missing_ones(user, other_user, staff):
    mine = make_run(user, "mine", {"lr": 1}, steps=1)
    theirs = make_run(other_user, "secret-name", {"lr": 2, "secret": "s3"}, steps=1)
    missing = theirs.pk + 100
    resp = client_for(user).get("/api/runs/compare/", {"runs": f"{mine.pk},{theirs.pk},{missing}"})
    assert resp.status_code == 200
    body = resp.json()
    assert [r["id"] for r in body["runs"]] == [mine.pk] and body["not_found"] == [theirs.pk, missing]
    assert "secret" not in resp.content.decode() and body["config_diff"] == []
    staff_body = client_for(staff).get("/api/runs/compare/", {"runs": f"{mine.pk},{theirs.pk}"}).json()
    assert [r["name"] for r in staff_body["runs"]] == ["mine", "secret-name"]
    assert {r["key"] for r in staff_body["config_diff"]} == {"lr", "secret"}


@pytestmark_db
@pytest.mark.parametrize("query", [{}, {"runs": "1,x"}, {"runs": ",".join(map(str, range(1, 12)))}])
def test_compare_bad_input_is_400_naming_runs(user, query):
    resp = client_for(user).get("/api/runs/compare/", query)
    assert resp.status_code == 400 and resp.json()["field"] == "runs"


@pytestmark_db
def test_compare_needs_a_login():
    assert client_for(None).get("/api/runs/compare/", {"runs": "1"}).status_code in (401, 403)


# --- the page ------------------------------------------------------------------------------------------


@pytestmark_db
@pytest.mark.parametrize(
    "query,field",
    [("runs=1,abc", "runs"), ("runs=" + ",".join(map(str, range(1, 12))), "runs"), ("runs=1&x=sideways", "x")],
)
def test_compare_page_bad_input_is_a_400_page_naming_the_parameter(client, user, query, field):
    client.force_login(user)
    resp = client.get(f"/compare/?{query}")
    assert resp.status_code == 400
    assert f"{field}: " in resp.content.decode()


@pytestmark_db
def test_compare_page_embeds_only_visible_runs_and_escapes_names(client, user, other_user):
    mine = make_run(user, "<script>alert(1)</script>", {"lr": 1}, steps=2)
    theirs = make_run(other_user, "their-secret", steps=1)
    client.force_login(user)
    resp = client.get(f"/compare/?runs={mine.pk},{theirs.pk}")
    html = resp.content.decode()
    assert resp.status_code == 200 and "<script>alert(1)" not in html and "their-secret" not in html
    assert "dist/compare.js" in html and 'id="compare-data"' in html
    assert client.get("/compare/").status_code == 200  # the bare form
    client.logout()
    assert client.get(f"/compare/?runs={mine.pk}").status_code == 302  # to the login page
