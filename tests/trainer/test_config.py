"""TrainConfig: strict parsing, error messages that name the field, schema and defaults file agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.config import ConfigError, TrainConfig

DEFAULTS = Path(__file__).resolve().parents[2] / "trainer" / "defaults.json"


def test_defaults_file_matches_dataclass_defaults() -> None:
    assert TrainConfig.from_dict(json.loads(DEFAULTS.read_text())) == TrainConfig()


def test_round_trip_and_partial_dict() -> None:
    cfg = TrainConfig.from_dict({"group_size": 4, "lr": 1, "task": "agent"})
    assert (cfg.group_size, cfg.lr, cfg.task) == (4, 1.0, "agent")
    assert isinstance(cfg.lr, float)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("patch", "field", "fragment"),
    [
        ({"bogus": 1}, "bogus", "unknown key"),
        ({"group_size": "8"}, "group_size", "expected an integer, got '8'"),
        ({"group_size": True}, "group_size", "expected an integer, got True"),
        ({"steps": 2.5}, "steps", "expected an integer"),
        ({"lr": False}, "lr", "expected a number, got False"),
        ({"filter_zero_variance": 1}, "filter_zero_variance", "expected true or false"),
        ({"mode": "async"}, "mode", "expected one of ['local', 'colocated', 'disaggregated']"),
        ({"group_size": 1}, "group_size", "must be >= 2, got 1"),
        ({"max_staleness": -1}, "max_staleness", "must be >= 0"),
        ({"d_model": 30, "n_head": 4}, "n_head", "must divide d_model (30)"),
        ({"prompt_terms_min": 5, "prompt_terms_max": 3}, "prompt_terms_min", "must not exceed"),
        ({"phase": "train_only"}, "batch_path", "is required for phase 'train_only'"),
        ({"min_valid_attempts": 9}, "min_valid_attempts", "must not exceed group_size (8)"),
    ],
)
def test_invalid_values_name_the_field(patch: dict, field: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict(patch)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_non_object_is_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict([1, 2])
    assert info.value.field == "config"


def test_json_schema_describes_every_field() -> None:
    schema = TrainConfig.json_schema()
    props = schema["properties"]
    assert schema["additionalProperties"] is False
    assert set(props) == set(TrainConfig().to_dict())
    for name, prop in props.items():
        assert prop["description"], name
        assert prop["default"] == getattr(TrainConfig(), name)
    assert props["mode"]["enum"] == ["local", "colocated", "disaggregated"]
    assert props["group_size"] == {**props["group_size"], "type": "integer", "minimum": 2}
    assert props["filter_zero_variance"]["type"] == "boolean"
    assert props["lr"]["type"] == "number"
    json.dumps(schema)  # serializable as is
