"""Captured samples: ingest into their own table, GET /api/runs/<id>/samples/ filters, ordering, keyset
cursor pages, visibility (owner or staff; others 404) and hostile input (400 naming the field)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from runs.models import RunEvent, Sample
from tests.realtime.conftest import run_make, train, user_make
from tests.sample_factory import sample_event

pytestmark = pytest.mark.django_db


def ingest(run, events: list[dict[str, Any]]):
    client = APIClient()
    return client.post(
        f"/api/runs/{run.pk}/ingest/", events, format="json", HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}"
    )


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def spread(n: int = 24) -> list[dict[str, Any]]:
    """n samples over 6 steps with varied rewards, advantages, finish reasons, staleness, engines, lengths."""
    return [
        sample_event(
            i + 1,
            step=1 + i // 4,
            group=i // 4,
            index=i % 4,
            reward=[0.0, 0.25, 0.5, 1.0][i % 4] - (0.5 if i % 7 == 0 else 0.0),
            advantage=float(i % 5) - 2.0,
            finish_reason=["stop", "length", "aborted"][i % 3],
            staleness=i % 3,
            engine=f"engine-{i % 2}",
            completion="1" * (1 + i % 6),
            prompt_index=i % 5,
        )
        for i in range(n)
    ]


@pytest.fixture
def owner():
    return user_make("alice")


@pytest.fixture
def loaded(owner):
    run = run_make(owner)
    events = spread()
    assert ingest(run, events).status_code == 200
    return run, [e["data"] for e in events]


def listed(client, run, query: str = "") -> list[dict[str, Any]]:
    response = client.get(f"/api/runs/{run.pk}/samples/?{query}")
    assert response.status_code == 200, response.content
    return response.json()["results"]


def test_ingest_stores_samples_in_their_own_table_once(owner):
    run = run_make(owner)
    batch = [train(1, step=1), *[sample_event(seq, step=1, index=seq) for seq in range(2, 6)]]
    first = ingest(run, batch)
    assert first.json() == {
        "stored": 5,
        "duplicates": 0,
        "last_seq": 1,
        "status": "running",
        "dropped": 0,
        "commands": [],
    }
    again = ingest(run, batch[2:] + [sample_event(6, step=2)])
    assert again.json()["stored"] == 1 and again.json()["duplicates"] == 3
    assert Sample.objects.filter(run=run).count() == 5
    assert list(RunEvent.objects.filter(run=run).values_list("type", flat=True)) == ["train"]  # not in the stream
    run.refresh_from_db()
    assert "sample" not in run.summary and run.summary["train"]["step"] == 1


def test_retention_keeps_the_newest_samples_of_a_run(owner, settings):
    run = run_make(owner)
    run.config = {"samples_keep": 5}
    run.save()
    ingest(run, [sample_event(seq, step=seq) for seq in range(1, 9)])
    assert sorted(Sample.objects.filter(run=run).values_list("step", flat=True)) == [4, 5, 6, 7, 8]
    settings.SAMPLES_MAX_PER_RUN = 3  # the platform's cap wins over the run's wish
    ingest(run, [sample_event(9, step=9)])
    assert sorted(Sample.objects.filter(run=run).values_list("step", flat=True)) == [7, 8, 9]


@pytest.mark.parametrize(
    ("query", "keep"),
    [
        ("step=3", lambda d: d["step"] == 3),
        ("step_min=2&step_max=4", lambda d: 2 <= d["step"] <= 4),
        ("reward_lte=0", lambda d: d["reward"] <= 0),
        ("reward_gte=0.5", lambda d: d["reward"] >= 0.5),
        ("advantage_lte=-1", lambda d: d["advantage"] <= -1),
        ("advantage_gte=1.5", lambda d: d["advantage"] >= 1.5),
        ("staleness_gte=1", lambda d: d["staleness"] >= 1),
        ("finish_reason=length", lambda d: d["finish_reason"] == "length"),
        ("engine=engine-1", lambda d: d["engine"] == "engine-1"),
        ("group=2", lambda d: d["group"] == 2),
        ("prompt_index=3", lambda d: d["prompt_index"] == 3),
        (
            "reward_lte=0&finish_reason=length&staleness_gte=1",
            lambda d: d["reward"] <= 0 and d["finish_reason"] == "length" and d["staleness"] >= 1,
        ),
    ],
)
def test_filters_select_exactly_the_matching_samples(loaded, owner, query, keep):
    run, data = loaded
    got = listed(client_for(owner), run, f"{query}&limit=200")
    want = [(d["step"], d["index"]) for d in data if keep(d)]
    assert want, "the data set must exercise the filter"
    assert sorted((r["step"], r["index"]) for r in got) == sorted(want)


@pytest.mark.parametrize("field", ["reward", "advantage", "length", "step"])
def test_ordering_by_a_field_breaks_ties_by_id(loaded, owner, field):
    run, _ = loaded
    for sign in ("", "-"):
        rows = listed(client_for(owner), run, f"ordering={sign}{field}&limit=200")
        keys = [(r[field], r["id"]) for r in rows]
        assert keys == sorted(keys, reverse=bool(sign)) and len(rows) == 24


def test_default_order_is_newest_first_with_stable_ids(loaded, owner):
    run, _ = loaded
    rows = listed(client_for(owner), run)
    assert [r["id"] for r in rows] == sorted((r["id"] for r in rows), reverse=True)
    detail = client_for(owner).get(f"/api/runs/{run.pk}/samples/{rows[0]['id']}/").json()
    assert detail["id"] == rows[0]["id"] and [t["role"] for t in detail["turns"]] == ["policy", "tool", "policy"]
    assert detail["reward_parts"] == rows[0]["reward_parts"]


@pytest.mark.parametrize("ordering", ["reward", "-reward", "-id", "advantage"])
def test_cursor_pages_walk_every_sample_once_forward_and_back(loaded, owner, ordering):
    run, _ = loaded
    client = client_for(owner)
    whole = [r["id"] for r in listed(client, run, f"ordering={ordering}&limit=200")]
    pages: list[list[int]] = []
    url: str | None = f"/api/runs/{run.pk}/samples/?ordering={ordering}&limit=5"
    previous_links = []
    while url:
        body = client.get(url).json()
        pages.append([r["id"] for r in body["results"]])
        previous_links.append(body["previous"])
        url = body["next"]
    assert [i for page in pages for i in page] == whole and len(pages) == 5
    assert previous_links[0] is None
    back = client.get(previous_links[2]).json()  # the third page's previous link gives the second page
    assert [r["id"] for r in back["results"]] == pages[1]


def test_pages_stay_exact_among_thousands_of_equal_rewards(owner):
    run = run_make(owner)
    for start in range(0, 1200, 400):
        ingest(run, [sample_event(seq, step=1, reward=0.0) for seq in range(start + 1, start + 401)])
    client, seen = client_for(owner), []
    url: str | None = f"/api/runs/{run.pk}/samples/?ordering=reward&limit=200"
    while url:
        body = client.get(url).json()
        seen += [r["id"] for r in body["results"]]
        url = body["next"]
    assert len(seen) == len(set(seen)) == 1200


def test_other_users_cannot_see_a_runs_samples_staff_can(loaded):
    run, _ = loaded
    sample_id = Sample.objects.filter(run=run).first().pk
    stranger = client_for(user_make("mallory"))
    for path in (f"/api/runs/{run.pk}/samples/", f"/api/runs/{run.pk}/samples/{sample_id}/"):
        assert stranger.get(path).status_code == 404
        assert APIClient().get(path).status_code in (401, 403)
        assert client_for(user_make(f"boss{len(path)}", staff=True)).get(path).status_code == 200
    # A sample id of another run is not found through this run.
    other = run_make(user_make("bob"))
    assert client_for(other.owner).get(f"/api/runs/{other.pk}/samples/{sample_id}/").status_code == 404


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("step=-1", "step"),
        ("step=abc", "step"),
        ("step=%C2%B2", "step"),
        ("step_max=99999999999", "step_max"),
        ("reward_lte=nan", "reward_lte"),
        ("reward_gte=1e999", "reward_gte"),
        ("advantage_lte=" + "9" * 40, "advantage_lte"),
        ("staleness_gte=1.5", "staleness_gte"),
        ("finish_reason=exploded", "finish_reason"),
        ("engine=" + "e" * 5000, "engine"),
        ("group=x", "group"),
        ("ordering=prompt", "ordering"),
        ("limit=0", "limit"),
        ("limit=100000", "limit"),
        ("cursor=%%%", "cursor"),
        ("cursor=cD1ub3RhbnVtYmVyfDE%3D", "cursor"),  # p=notanumber|1
        ("rewrd_lte=0", "rewrd_lte"),
    ],
)
def test_bad_filter_values_are_400_naming_the_field(loaded, owner, query, field):
    run, _ = loaded
    response = client_for(owner).get(f"/api/runs/{run.pk}/samples/?{query}")
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field


def test_hostile_sample_events_are_refused_or_kept_verbatim(owner):
    run = run_make(owner)
    huge = sample_event(1, step=1)
    huge["data"]["prompt"] = "x" * 100_000
    response = ingest(run, [huge])
    assert response.status_code == 400 and "data.prompt" in response.json()["detail"]
    script = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    assert ingest(run, [sample_event(2, step=1, prompt=script, completion=script)]).status_code == 200
    row = listed(client_for(owner), run)[0]
    assert row["prompt"] == script and row["completion"] == script  # JSON is data; the page escapes it


def test_inspector_page_has_the_runs_visibility(loaded, owner):
    from django.test import Client

    run, _ = loaded
    path = f"/runs/{run.pk}/samples/"
    assert Client().get(path).status_code == 302  # to the login page
    page = Client()
    page.force_login(owner)
    response = page.get(path)
    assert response.status_code == 200 and b"dist/samples.js" in response.content
    stranger = Client()
    stranger.force_login(user_make("eve"))
    assert stranger.get(path).status_code == 404


def test_the_browsers_sample_type_names_every_field_the_api_sends():
    import re
    from pathlib import Path

    from runs.api.samples import SampleDetailSerializer

    source = (Path(__file__).resolve().parents[2] / "frontend/static/src/lib/samples.ts").read_text()
    block = re.search(r"export interface Sample \{(.*?)\n\}", source, re.S)
    assert block is not None
    declared = set(re.findall(r"(\w+)\??:", block.group(1)))
    assert declared == set(SampleDetailSerializer.Meta.fields)
