"""trainer/histograms.py: bucket edges fixed per run, counts per bucket (edges, clamping, NaN), the four
distributions of a step, and the train event contract that carries them (trainer/events.py)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithm import group_advantages as torch_group_advantages
from trainer.episodes import Group, lockstep_rows
from trainer.events import EventSchemaError, validate_event
from trainer.histograms import (
    group_advantages,
    histogram,
    integer_edges,
    linear_edges,
    run_edges,
    step_histograms,
)


def make_group(group_id: int, rewards: list[float], versions: list[int], generated: int = 3) -> Group:
    turn = [-1, -1] + [0] * generated
    return Group(
        group_id=group_id,
        epoch=0,
        prompt_index=group_id,
        rows=lockstep_rows(
            "s",
            [[1] * len(turn) for _ in rewards],
            [[0.0] * len(turn) for _ in rewards],
            turn,
            versions,
            ["r"] * len(versions),
            ["e0"] * len(versions),
        ),
        rewards=rewards,
        exact=[float(r == 1.0) for r in rewards],
    )


@pytest.mark.parametrize(
    ("values", "edges", "counts"),
    [
        ([0.0, 0.1, 0.5, 0.99, 1.0], [0.0, 0.5, 1.0], [2, 3]),  # the last bucket is closed: 1.0 counts in it
        ([-3.0, 7.0], [0.0, 0.5, 1.0], [1, 1]),  # outside the edges: clamped into the end buckets
        ([float("nan"), 0.2], [0.0, 0.5, 1.0], [1, 0]),  # NaN is not counted
        ([0, 1, 1, 2, 5], [-0.5, 0.5, 1.5, 2.5], [1, 2, 2]),  # integer buckets
        ([0.5, 1.5, 9.0], [0.0, 1.0, 10.0], [1, 2]),  # uneven edges
        ([], [0.0, 1.0], [0]),
    ],
)
def test_histogram_counts_each_value_in_its_bucket(values, edges, counts) -> None:
    assert histogram(values, edges) == {"edges": edges, "counts": counts}


def test_edges_are_increasing_and_sized() -> None:
    assert linear_edges(0.0, 1.0, 4) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert integer_edges(0, 2) == [-0.5, 0.5, 1.5, 2.5]
    with pytest.raises(ValueError):
        linear_edges(1.0, 1.0, 3)
    edges = run_edges(group_size=8, max_staleness=2, response_len_max=3)
    assert edges["reward"][0] == 0.0 and edges["reward"][-1] == 1.0 and len(edges["reward"]) == 11
    assert edges["advantage"][0] == pytest.approx(-math.sqrt(7)) and edges["advantage"][-1] == pytest.approx(7**0.5)
    assert edges["response_length"] == integer_edges(0, 3)
    assert edges["staleness"] == integer_edges(0, 2)
    long = run_edges(group_size=2, max_staleness=0, response_len_max=400)["response_length"]
    assert len(long) == 17 and long[-1] == 400.0


def test_advantages_match_the_learner_formula_and_stay_within_the_edges() -> None:
    rows = [[0.0, 0.0, 0.0, 1.0], [0.2, 0.4, 0.4, 1.0], [0.5, 0.5, 0.5, 0.5]]
    expected = torch_group_advantages(torch.tensor(rows)).tolist()
    for row, want in zip(rows, expected, strict=True):
        assert group_advantages(row) == pytest.approx(want, abs=1e-5)
        assert max(abs(a) for a in group_advantages(row)) <= math.sqrt(len(row) - 1) + 1e-6


def test_step_histograms_cover_every_sample_of_the_step() -> None:
    edges = run_edges(group_size=4, max_staleness=2, response_len_max=3)
    groups = [
        make_group(1, [0.0, 0.0, 1.0, 1.0], versions=[4]),  # trained into version 5: staleness 0
        make_group(2, [0.5, 0.5, 0.5, 0.5], versions=[2, 3]),  # oldest token at version 2: staleness 2
    ]
    h = step_histograms(groups, version=5, edges=edges)
    assert h["reward"]["counts"] == [2, 0, 0, 0, 0, 4, 0, 0, 0, 2]
    assert h["staleness"] == {"edges": edges["staleness"], "counts": [4, 0, 4]}
    assert h["response_length"]["counts"] == [0, 0, 0, 8]
    # Advantages: +-1 in the first group, 0 for the constant group.
    adv = h["advantage"]
    assert sum(adv["counts"]) == 8
    centre = len(adv["counts"]) // 2
    assert adv["counts"][centre] == 4  # zeros sit at the left edge of the centre bucket


def train_event(histograms) -> dict:
    data = {"step": 1, "loss": 0.0, "reward_mean": 0.0, "exact_match": 0.0, "kl": 0.0, "entropy": 0.0}
    return {"seq": 1, "type": "train", "data": {**data, "staleness_max": 0, "histograms": histograms}}


def test_train_event_accepts_histograms_from_the_module() -> None:
    edges = run_edges(group_size=4, max_staleness=1, response_len_max=3)
    h = step_histograms([make_group(1, [0.0, 1.0, 1.0, 0.5], versions=[0])], version=1, edges=edges)
    assert validate_event(train_event(h)).data["histograms"] == h


@pytest.mark.parametrize(
    ("histograms", "field"),
    [
        ([], "data.histograms"),
        ({"rewards": {"edges": [0, 1], "counts": [1]}}, "data.histograms.rewards"),
        ({"reward": {"edges": [0, 1]}}, "data.histograms.reward"),
        ({"reward": {"edges": [0, 1, 2], "counts": [1]}}, "data.histograms.reward"),
        ({"reward": {"edges": list(range(66)), "counts": [0] * 65}}, "data.histograms.reward"),
        ({"reward": {"edges": [1, 0], "counts": [1]}}, "data.histograms.reward.edges"),
        ({"reward": {"edges": [0, float("inf")], "counts": [1]}}, "data.histograms.reward.edges"),
        ({"reward": {"edges": [0, 1], "counts": [-1]}}, "data.histograms.reward.counts"),
        ({"reward": {"edges": [0, 1], "counts": [True]}}, "data.histograms.reward.counts"),
    ],
)
def test_train_event_refuses_malformed_histograms_naming_the_field(histograms, field) -> None:
    with pytest.raises(EventSchemaError, match=f"^{field.replace('.', '[.]')}:"):
        validate_event(train_event(histograms))
