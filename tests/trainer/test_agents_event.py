"""The `agents` event of a run with an agent environment (trainer/reports.py `agents_data`, emitted by the loop's
report step): a tiny local-mode `digits` run (one process, a real session server over HTTP) emits one per step,
valid against the schema, whose counters match what the server and the workers served; and the pure folding of
server and worker stats and reward parts."""

from __future__ import annotations

import math

import torch

from trainer.config import TrainConfig
from trainer.episodes import Group
from trainer.event_fields import MAP_MAX, NAME_MAX
from trainer.event_schema import data_clean
from trainer.loop import TrainingRun
from trainer.reports import agents_data, reward_parts_mean
from trainer.sinks import EventEmitter

from .test_topology import Capture

torch.set_num_threads(1)
CFG = TrainConfig.from_dict(
    {
        "environment": "digits",
        "context_tokens": 32,
        "steps": 2,
        "prompts_per_step": 4,
        "group_size": 4,
        "num_engines": 1,
        "num_workers": 1,
        "worker_capacity": 4,
        "eval_every": 0,
        "d_model": 32,
        "n_layer": 1,
        "n_head": 2,
        "mode": "local",
    }
)


def test_a_local_digits_run_emits_one_agents_event_per_step() -> None:
    cap = Capture()
    run = TrainingRun(CFG, emitter=EventEmitter([cap]))
    result = run.run()
    assert result.status == "succeeded"
    events = cap.of("agents")
    assert [e["step"] for e in events] == [1, 2]
    for e in events:
        assert data_clean("agents", e) == e  # every field declared, within its bounds
        assert set(e["sessions_per_engine"]) <= {"engine-0"}
        assert e["sessions"] >= 0 and e["waiting"] >= 0
        assert set(e["status"]) == {"400", "401", "404", "409", "410", "413", "503"}
        assert e["tool_calls"] == e["valid_tool_calls"] == e["tool_errors"] == 0  # digits calls no tool
        assert e["reward_parts"] and all(k.startswith("term_") for k in e["reward_parts"])
        assert all(0.0 <= v <= 1.0 for v in e["reward_parts"].values())
    first, last = events
    # digits runs a group as one request with n = G choices of 3 tokens each: at least a step's worth of groups
    # and tokens per step, counters cumulative.
    assert first["requests"] >= CFG.prompts_per_step and first["tokens"] >= CFG.prompts_per_step * CFG.group_size * 3
    assert last["requests"] > first["requests"] and last["tokens"] > first["tokens"] > 0
    assert last["episodes"] >= 2 * CFG.prompts_per_step * CFG.group_size
    assert last["status"]["410"] == last["status"]["503"] == 0


def _group(parts: list[dict]) -> Group:
    g = Group.__new__(Group)
    g.meta = {"reward_parts": parts}
    return g


def test_agents_data_sums_servers_and_workers_and_averages_reward_parts() -> None:
    servers = [
        {
            "sessions": 3,
            "sessions_per_engine": {"e0": 2, "e1": 1},
            "waiting": 1,
            "requests": 10,
            "tokens": 100,
            "status": {"410": 2, "503": 1},
        },
        {"sessions": 1, "sessions_per_engine": {"e1": 1}, "waiting": 0, "requests": 5, "tokens": 7, "status": {}},
    ]
    workers = [
        {"agents": {"episodes": 4, "tool_calls": 4, "valid_tool_calls": 3, "tool_errors": 1}},
        {"agents": {}},
    ]
    groups = [_group([{"answer": 1.0, "valid_call": 1.0}, {"answer": 0.0}]), _group([{"answer": 0.5}])]
    data = agents_data(7, servers, workers, groups)
    assert data == {
        "step": 7,
        "sessions": 4,
        "sessions_per_engine": {"e0": 2, "e1": 2},
        "waiting": 1,
        "requests": 15,
        "tokens": 107,
        "status": {"400": 0, "401": 0, "404": 0, "409": 0, "410": 2, "413": 0, "503": 1},
        "episodes": 4,
        "tool_calls": 4,
        "valid_tool_calls": 3,
        "tool_errors": 1,
        "reward_parts": {"answer": 0.5, "valid_call": 1.0},
    }
    assert data_clean("agents", data) == data


def test_reward_parts_keep_the_bounds_of_the_schema() -> None:
    many = {f"p{i:03d}": 1.0 for i in range(MAP_MAX + 10)}
    parts = reward_parts_mean([_group([{**many, "x" * (NAME_MAX + 5): 2.0, "nan": math.nan, "flag": True}])])
    assert len(parts) == MAP_MAX and all(len(k) <= NAME_MAX for k in parts)
    assert "nan" not in parts and "flag" not in parts
    assert data_clean("agents", {**agents_data(1, [], [], []), "reward_parts": parts})["reward_parts"] == parts
