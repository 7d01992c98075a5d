"""What the ingest folds into a run summary, and the board's cut of it, have the declared shapes
(runs/summary_types.py): the types the dashboard's TypeScript is checked against describe the built values."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import get_type_hints

from runs.models import RunEvent
from runs.summary_types import BoardSummary, ProgressSummary, RunHistogram, RunSummary
from runs.telemetry.dashboard import board_summary
from runs.telemetry.ingest import summary_fold
from trainer.event_schema import DATA_MODELS, data_clean

SPAN = {"start": 100.0, "end": 101.5}
DATA = {
    "gate": {"state": "open", "version": 2, "active": 1, "waiting": 0, "engines": [{"engine": "e0", "active": 1}]},
    "version": {"version": 2, "published_at": 101.0, "pause_ms": 12.5, "phases": {"drain": SPAN}, "drained": 3},
    "sampler": {"epoch": 0, "group_count": 16, "dataset_size": 64, "consumed_in_epoch": 16},
    "train": {
        "step": 2,
        "loss": 0.5,
        "reward_mean": 0.25,
        "exact_match": 0.1,
        "kl": 0.01,
        "entropy": 1.2,
        "staleness_max": 1,
        "steps_total": 10,
        "eval_span": SPAN,
        "histograms": {"reward": {"edges": [0.0, 0.5, 1.0], "counts": [3, 5]}},
    },
    "checkpoint": {"step": 2, "version": 2, "state": "saved", "path": "var/ckpt-2"},
    "agents": {
        "step": 2,
        "sessions": 3,
        "sessions_per_engine": {"e0": 3},
        "waiting": 0,
        "requests": 9,
        "tokens": 120,
        "status": {"409": 1},
        "episodes": 8,
        "tool_calls": 4,
        "valid_tool_calls": 3,
        "tool_errors": 1,
        "reward_parts": {"format": 0.5},
    },
    "log": {"level": "info", "message": "not summarized"},
}


def keys_of(td: type) -> set[str]:
    return set(get_type_hints(td))


def test_the_folded_summary_has_the_declared_keys_and_each_part_its_model():
    events = [
        RunEvent(type=etype, data=data_clean(etype, data), ts=datetime.fromtimestamp(100.0 + i, tz=UTC))
        for i, (etype, data) in enumerate(DATA.items())
    ]
    summary = summary_fold(RunSummary(), events)
    assert set(summary) == keys_of(RunSummary) - {"eval"}  # `eval`: an eval run's final metrics only
    for etype in ("gate", "version", "sampler", "train", "checkpoint", "agents"):
        assert DATA_MODELS[etype].model_validate(summary[etype]).model_dump(exclude_unset=True) == summary[etype]
    assert set(summary["progress"]) == keys_of(ProgressSummary)
    assert all(set(h) == keys_of(RunHistogram) for h in summary["hist"].values()) and summary["hist"]
    assert summary["last_event_at"] == 106.0


def test_the_board_cut_has_the_declared_shape_even_from_a_hand_written_summary():
    written = {"gate": {"state": "x" * 500}, "train": {"step": ["x"], "reward_mean": 1}, "sampler": {"epoch": True}}
    cut = board_summary(written)
    assert set(cut) == keys_of(BoardSummary)
    assert cut == {
        "gate": {"state": None},
        "version": {"version": None},
        "sampler": {"epoch": None},
        "train": {"reward_mean": 1.0, "step": None},
    }
