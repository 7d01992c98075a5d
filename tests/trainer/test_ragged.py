"""Ragged groups (trainer/episodes.py): rows of different lengths and turn structures batch with padding and
mask 0, groups of different sizes normalize their advantages each on its own, the learner's recomputation keeps
each row's length, and a group saved in the older lock-step layout (checkpoint format 2) still loads."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from trainer.algorithm import PAD_ID, batch_from_groups, group_advantages
from trainer.checkpoint import checkpoint_load, checkpoint_save
from trainer.config import TrainConfig
from trainer.engine import Engine
from trainer.episodes import Group, GroupTicket, Row, Turn, run_group
from trainer.learner import Learner
from trainer.plain import group_from_plain, group_to_plain, scheduler_state_from_plain
from trainer.problems import task_build

torch.set_num_threads(1)
CFG = TrainConfig(task="agent", group_size=2, mode="local", device="cpu")


def row(session: str, fed: list[int], gen: list[int], version: int, *, tail: list[int] = ()) -> Row:
    """fed tokens, one generated turn (log-prob -0.25 each), then optional fed tokens (a tool reply)."""
    tokens = [*fed, *gen, *tail]
    mask = [0] * len(fed) + [1] * len(gen) + [0] * len(tail)
    return Row(
        session=session,
        tokens=tokens,
        logprobs=[-0.25 * m for m in mask],
        mask=mask,
        versions=[version if m else -1 for m in mask],
        turns=[Turn(len(fed), len(fed) + len(gen), f"{session}/r0", "engine-0", "stop")],
    )


def test_rows_of_different_lengths_batch_padded_with_mask_zero() -> None:
    a = Group(1, 0, 0, [row("a0", [11, 1], [2, 3, 4], 5), row("a1", [11, 1], [2], 6, tail=[10, 7])], [1.0, 0.0], [1, 0])
    b = Group(
        2, 0, 1, [row("b0", [11], [5], 4), row("b1", [11], [6, 7], 4), row("b2", [11], [8], 4)], [0.5, 0, 1], [0] * 3
    )
    batch = batch_from_groups([a, b])
    assert batch.tokens.shape == (5, 5)  # every row, padded to the longest (5 tokens)
    assert batch.tokens[0].tolist() == [11, 1, 2, 3, 4]
    assert batch.tokens[1].tolist() == [11, 1, 2, 10, 7]
    assert batch.tokens[2].tolist() == [11, 5, PAD_ID, PAD_ID, PAD_ID]
    # Shifted: position t predicts token t+1. Generated tokens carry loss; prompt, tool reply and padding do not.
    assert batch.mask.tolist() == [
        [0, 1, 1, 1],
        [0, 1, 0, 0],
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 0, 0],
    ]
    assert batch.behaviour_logp[1].tolist() == [0.0, -0.25, 0.0, 0.0]
    assert batch.versions[1].tolist() == [-1, 6, -1, -1] and batch.versions[3].tolist() == [4, 4, -1, -1]
    # Advantages normalized within each group, whatever its size.
    expected = torch.cat([group_advantages(torch.tensor([g.rewards])).flatten() for g in (a, b)])
    assert torch.equal(batch.advantages, expected) and batch.advantages[:2].tolist() == pytest.approx([1, -1], abs=1e-5)
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5, 0.0, 1.0]
    assert (a.generated_tokens, b.generated_tokens, a.versions, b.min_version) == (4, 4, [5, 6], 4)


def test_the_learner_recomputes_every_row_at_its_own_length_and_trains_on_ragged_groups() -> None:
    learner = Learner(CFG)
    a = Group(1, 0, 0, [row("a0", [11, 1], [2, 3, 4], 0), row("a1", [11, 1], [2], 0, tail=[10])], [1.0, 0.0], [1, 0])
    b = Group(
        2, 0, 1, [row("b0", [11], [5], 0), row("b1", [11], [6, 7], 0), row("b2", [11], [8], 0)], [0.5, 0, 1], [0] * 3
    )
    logprobs = learner.logprobs([a, b])
    assert [[len(r) for r in g] for g in logprobs] == [[5, 4], [2, 3, 2]]
    assert all(r[0] == 0.0 and all(x < 0 for x in r[1:]) for g in logprobs for r in g)
    alone = learner.logprobs([b])  # a row's numbers do not depend on the padding its batch needed
    assert max(abs(x - y) for r, s in zip(logprobs[1], alone[0]) for x, y in zip(r, s)) < 1e-5
    stats = learner.train_step([a, b])
    assert stats["version"] == 1 and stats["reward_mean"] == pytest.approx(2.5 / 5)


def test_a_row_with_misaligned_fields_and_a_group_with_missing_rewards_are_refused() -> None:
    with pytest.raises(ValueError, match="one entry per token"):
        Row("s", [1, 2], [0.0], [0, 1], [-1, 0], [])
    with pytest.raises(ValueError, match="one entry per episode"):
        Group(1, 0, 0, [row("a", [1], [2], 0)], [1.0, 0.0], [0.0, 0.0])


def _lockstep_group(cfg: TrainConfig) -> Group:
    task, engine = task_build(cfg), Engine(cfg, "engine-0")
    return asyncio.run(
        run_group(
            task,
            GroupTicket(3, 1, 3),
            task.train_prompts[3],
            group_size=2,
            seed=0,
            generate=engine.generate,
            session_id="w0:g3",
        )
    )


def test_run_group_rows_share_one_turn_structure_and_round_trip_exactly() -> None:
    g = _lockstep_group(CFG)
    task = task_build(CFG)
    assert len({len(r.tokens) for r in g.rows}) == 1 and g.rows[0].mask == g.rows[1].mask
    assert [t.request_id for t in g.rows[1].turns] == [f"w0:g3/t{k}" for k in range(task.turns)]
    assert all(t.end - t.start == task.turn_len() and t.engine == "engine-0" for t in g.rows[0].turns)
    assert all(r.session == "w0:g3" for r in g.rows)
    assert group_from_plain(group_to_plain(g)) == g


def test_a_lockstep_group_of_an_older_checkpoint_loads_as_rows(tmp_path) -> None:
    g = _lockstep_group(CFG)
    # The layout trainer.plain wrote before groups were ragged: shared token_turn, per-turn provenance.
    first = g.rows[0]
    token_turn = [-1] * len(first.tokens)
    for k, t in enumerate(first.turns):
        token_turn[t.start : t.end] = [k] * (t.end - t.start)
    old = {
        "group_id": 3,
        "epoch": 1,
        "prompt_index": 3,
        "tokens": [r.tokens for r in g.rows],
        "logprobs": [r.logprobs for r in g.rows],
        "token_turn": token_turn,
        "versions": [first.versions[t.start] for t in first.turns],
        "request_ids": [t.request_id for t in first.turns],
        "engines": [t.engine for t in first.turns],
        "rewards": g.rewards,
        "exact": g.exact,
        "filtered": "",
        "meta": {"attempt": "w0:g3"},
    }
    result = {"rewards": g.rewards, "payload": {"group": old}, "group_id": 3, "attempt": "w0:g3", "meta": {}}
    ready = [(5, result, {"ticket": {"group_id": 3, "epoch": 1, "prompt_index": 3}})]
    ckpt = tmp_path / "ckpt"
    checkpoint_save(ckpt, step=1, meta={"version": 1}, state={"scheduler": {"ready": ready, "seq": 6}})
    meta_path = ckpt / "step-000001" / "meta.json"
    meta_path.write_text(meta_path.read_text().replace('"format": 3', '"format": 2'))  # as older code wrote it
    meta, state = checkpoint_load(ckpt)
    assert meta["format"] == 2
    ((seq, loaded_result, ticket),) = scheduler_state_from_plain(state["scheduler"])["ready"]
    loaded = loaded_result.payload
    assert seq == 5 and ticket == GroupTicket(3, 1, 3)
    assert loaded == dataclasses.replace(g, meta={"attempt": "w0:g3"})  # rows, turns, versions, request ids
    assert torch.equal(batch_from_groups([loaded]).mask, batch_from_groups([g]).mask)
