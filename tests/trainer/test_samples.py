"""Sample capture (trainer/samples.py): which groups are posted, what each sample carries, and the schema's
limits (trainer/sample_schema.py) as validate_event applies them."""

from __future__ import annotations

import asyncio

import pytest

from trainer.config import ConfigError, TrainConfig
from trainer.episodes import Group, GroupTicket, lockstep_rows, run_group
from trainer.events import EventSchemaError, validate_event
from trainer.problems import encode, task_build
from trainer.sample_schema import MAX_SAMPLE_TEXT
from trainer.samples import groups_pick, samples_capture


def agent_group(cfg: TrainConfig, *, group_id: int, answers: list[str], version: int = 3) -> Group:
    """A real agent-task group whose G rows answer `answers[k]` each turn (a scripted generate function)."""
    task = task_build(cfg)

    async def generate(session_id, new_tokens, n, seed, request_id, greedy, continues=False, last=False):
        return {
            "tokens": [encode(a[:n]) for a in answers],
            "logprobs": [[-0.5] * n for _ in answers],
            "version": version,
            "engine": "engine-1",
        }

    ticket = GroupTicket(group_id=group_id, epoch=0, prompt_index=group_id)
    prompt = task.train_prompts[group_id]
    return asyncio.run(
        run_group(
            task, ticket, prompt, group_size=len(answers), seed=0, generate=generate, session_id=f"w0:g{group_id}"
        )
    )


def group_with_rewards(group_id: int, rewards: list[float]) -> Group:
    rows = lockstep_rows("s", [[1]] * len(rewards), [[0.0]] * len(rewards), [-1], [0], ["r"], ["e"])
    return Group(group_id, 0, 0, rows, rewards, rewards)


def test_pick_takes_best_and_worst_by_mean_reward_plus_a_seeded_draw():
    groups = [group_with_rewards(i, [r, 0.0]) for i, r in enumerate([0.2, 0.9, 0.0, 0.5, 0.4])]
    picked = groups_pick(groups, step=7, count=2, best_worst=True, seed=1)
    assert dict(picked)[1] == "best" and dict(picked)[2] == "worst"
    assert sum(1 for _, why in picked if why == "sampled") == 2
    assert picked == groups_pick(groups, step=7, count=2, best_worst=True, seed=1)  # deterministic
    assert [i for i, _ in picked] == sorted(i for i, _ in picked)
    assert groups_pick(groups, step=7, count=0, best_worst=False, seed=1) == []
    assert len(groups_pick(groups, step=7, count=50, best_worst=True, seed=1)) == 5  # each group once


def test_a_multi_turn_group_becomes_whole_samples_with_turns_rewards_and_advantages():
    cfg = TrainConfig(task="agent", mode="local", modulus=10, answer_terms=3, samples_groups_per_step=0)
    task = task_build(cfg)
    prompt = task.train_prompts[4]
    right = task.answer_text(prompt)
    g = agent_group(cfg, group_id=4, answers=[right[0], ">", "9"], version=3)
    # Row 0 always writes the first answer digit: turn 1 right. Row 1 writes '>' (malformed).
    samples = samples_capture([g], task=task, step=5, cfg=cfg)
    assert len(samples) == 3 and {s["pick"] for s in samples} == {"best"}  # one group: best (and worst) once
    first = samples[0]
    assert first["prompt"] == "^" + "".join(task.fmt(prompt.term(k, 10)) for k in range(prompt.shown)) + ">"
    roles = [t["role"] for t in first["turns"]]
    assert roles == ["policy", "tool", "policy", "tool", "policy"]
    assert first["turns"][1]["text"] == task.fmt(prompt.term(prompt.shown, 10)) + ">"  # the tool's reply
    assert all(t["version"] == 3 and t["engine"] == "engine-1" for t in first["turns"] if t["role"] == "policy")
    assert first["completion"] == right[0] * 3 and first["length"] == 3
    assert first["reward_parts"]["turn_1"] == 1.0
    assert first["reward"] == pytest.approx(sum(first["reward_parts"].values()) / 3)
    assert (first["version_min"], first["version_max"], first["staleness"]) == (3, 3, 1)
    assert first["session"] == "w0:g4" and first["group"] == 4 and first["step"] == 5
    assert samples[1]["finish_reason"] == "length" and first["finish_reason"] == "stop"
    assert sum(s["advantage"] for s in samples) == pytest.approx(0.0, abs=1e-5)
    for k, s in enumerate(samples):
        assert s["index"] == k
        validate_event({"seq": k + 1, "type": "sample", "data": dict(s)})


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"finish_reason": "exploded"}, "data.finish_reason"),
        ({"prompt": "x" * (MAX_SAMPLE_TEXT + 1)}, "data.prompt"),
        ({"reward": float("nan")}, "data.reward"),
        ({"step": True}, "data.step"),
        ({"turns": [{"role": "system", "text": ""}]}, "data.turns[0]"),
        ({"turns": [{"role": "tool", "text": 5}]}, "data.turns[0].text"),
        ({"reward_parts": {"a": "1"}}, "data.reward_parts"),
        ({"session": "s" * 201}, "data.session"),
    ],
)
def test_bad_sample_data_is_refused_naming_the_field(change, field):
    cfg = TrainConfig(task="agent", mode="local", answer_terms=2)
    data = dict(
        samples_capture([agent_group(cfg, group_id=0, answers=["1", "2"])], task=task_build(cfg), step=1, cfg=cfg)[0]
    )
    with pytest.raises(EventSchemaError, match=field.replace("[", r"\[").replace("]", r"\]")):
        validate_event({"seq": 1, "type": "sample", "data": {**data, **change}})


@pytest.mark.parametrize(
    ("key", "value"), [("samples_groups_per_step", -1), ("samples_groups_per_step", 65), ("samples_keep", 10**7)]
)
def test_capture_config_is_bounded(key, value):
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_dict({key: value})
    assert err.value.field == key
    with pytest.raises(ConfigError):
        TrainConfig.from_dict({"samples_best_worst": 1})
