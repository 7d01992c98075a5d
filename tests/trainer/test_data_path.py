"""The run's data path in one process: the channel's collector weighs each group by its generated tokens and
counts per key, and the learner's token budget takes `prompts_per_step` groups of the task's length."""

from __future__ import annotations

import pytest

from rollout.channel import Channel
from trainer.config import TrainConfig
from trainer.data_path import GroupTokens, batch_tokens, build_filters, channel_key, group_tokens
from trainer.episodes import Group, lockstep_rows
from trainer.problems import task_build

CFG = TrainConfig(task="agent", group_size=3, prompts_per_step=4, seed=1)


def _group(group_id: int, cfg: TrainConfig = CFG, turns: int | None = None) -> Group:
    task = task_build(cfg)
    turns = task.turns if turns is None else turns
    token_turn = [-1] * 5 + [t for t in range(turns) for _ in range(task.turn_len())] + [-1] * 2
    rows = [[1] * len(token_turn) for _ in range(cfg.group_size)]
    return Group(
        group_id=group_id,
        epoch=0,
        prompt_index=0,
        rows=lockstep_rows(
            f"s{group_id}",
            rows,
            [[0.0] * len(token_turn) for _ in rows],
            token_turn,
            [0] * turns,
            [f"r{t}" for t in range(turns)],
            ["engine-0"] * turns,
        ),
        rewards=[0.0] * cfg.group_size,
        exact=[0.0] * cfg.group_size,
    )


def test_a_groups_weight_is_its_generated_tokens():
    task = task_build(CFG)
    assert group_tokens(_group(0)) == CFG.group_size * task.turns * task.turn_len()
    assert batch_tokens(CFG) == CFG.prompts_per_step * group_tokens(_group(0))


def test_the_learner_budget_takes_prompts_per_step_groups_and_the_collector_counts_per_key():
    key = channel_key(CFG)
    channel = Channel.create("data-path-test", local=True, collector=GroupTokens)
    try:
        for group_id in range(6):
            channel.put(_group(group_id), key=key)  # no weight given: the collector sets it
        taken = channel.get_batch(target_weight=batch_tokens(CFG), key=key)
        assert [g.group_id for g in taken] == [0, 1, 2, 3]  # FIFO, exactly prompts_per_step groups
        short = _group(6, turns=1)  # a group with fewer generated tokens weighs less: more of them fit
        channel.put(short, key=key)
        assert [g.group_id for g in channel.get_batch(target_weight=2 * group_tokens(_group(0)), key=key)] == [4, 5]
        metrics = channel.metrics()
        assert metrics[f"{key}/groups_in"] == 7.0 and metrics[f"{key}/queued"] == 1.0
        assert metrics[f"{key}/tokens_in"] == 6 * group_tokens(_group(0)) + group_tokens(short)
    finally:
        channel.close()


@pytest.mark.parametrize("zero_variance,min_valid,expected", [(True, 1, 2), (False, 0, 0), (True, 0, 1)])
def test_build_filters_follows_the_config(zero_variance: bool, min_valid: int, expected: int):
    cfg = CFG.replace(filter_zero_variance=zero_variance, min_valid_attempts=min_valid)
    assert len(build_filters(cfg)) == expected
