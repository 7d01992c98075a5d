"""Sample capture: which episodes of a trained batch the run posts as `sample` events, and their data.

Every step, `samples_groups_per_step` groups chosen by a seeded draw, plus (with `samples_best_worst`) the
groups with the best and the worst mean reward, each posted whole (all G episodes). Pure functions over the
batch the step just trained on; `trainer.loop` emits what `samples_capture` returns. The schema and its
limits are `trainer.sample_schema`.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from trainer.episodes import Group
from trainer.problems import VOCAB, SequenceTask, decode
from trainer.sample_schema import MAX_SAMPLE_NAME, MAX_SAMPLE_TEXT, MAX_SAMPLE_TURNS, SampleData, SampleTurn

if TYPE_CHECKING:
    from trainer.config import TrainConfig


def groups_pick(groups: list[Group], *, step: int, count: int, best_worst: bool, seed: int) -> list[tuple[int, str]]:
    """(index in `groups`, why) of the groups to capture, in batch order; each group at most once."""
    if not groups:
        return []
    picks: dict[int, str] = {}
    if best_worst:
        means = [sum(g.rewards) / max(1, len(g.rewards)) for g in groups]
        picks[max(range(len(groups)), key=lambda i: (means[i], -i))] = "best"
        picks.setdefault(min(range(len(groups)), key=lambda i: (means[i], i)), "worst")
    rest = [i for i in range(len(groups)) if i not in picks]
    for i in random.Random(seed * 1_000_003 + step).sample(rest, min(count, len(rest))):
        picks[i] = "sampled"
    return sorted(picks.items())


def samples_capture(groups: list[Group], *, task: SequenceTask, step: int, cfg: TrainConfig) -> list[SampleData]:
    """The `sample` events' data of the step that produced version `step` from `groups`."""
    out: list[SampleData] = []
    picked = groups_pick(
        groups, step=step, count=cfg.samples_groups_per_step, best_worst=cfg.samples_best_worst, seed=cfg.seed
    )
    for i, why in picked:
        out += group_samples(groups[i], task=task, step=step, pick=why)
    return out


def group_samples(g: Group, *, task: SequenceTask, step: int, pick: str) -> list[SampleData]:
    """Every episode of group `g` as sample data (advantages normalized within the group, as GRPO does)."""
    prompt = task.train_prompts[g.prompt_index]
    n = len(g.rewards)
    mean = sum(g.rewards) / max(1, n)
    std = (sum((r - mean) ** 2 for r in g.rewards) / max(1, n)) ** 0.5
    session = g.request_ids[0].rsplit("/t", 1)[0] if g.request_ids else ""
    vmin, vmax = min(g.versions, default=step - 1), max(g.versions, default=step - 1)
    out: list[SampleData] = []
    for k, row in enumerate(g.tokens):
        turns, prompt_text = _turns(g, row)
        generated = [t for t, turn in zip(row, g.token_turn) if turn >= 0]
        completion = "".join(t["text"] for t in turns if t["role"] == "policy")
        out.append(
            SampleData(
                step=step,
                group=g.group_id,
                index=k,
                prompt_index=g.prompt_index,
                session=session[:MAX_SAMPLE_NAME],
                engine=(g.engines[-1] if g.engines else "")[:MAX_SAMPLE_NAME],
                finish_reason="stop" if all(VOCAB[t].isdigit() for t in generated) else "length",
                pick=pick,
                prompt=prompt_text[:MAX_SAMPLE_TEXT],
                completion=completion[:MAX_SAMPLE_TEXT],
                turns=turns[:MAX_SAMPLE_TURNS],
                reward=float(g.rewards[k]),
                reward_parts=task.reward_parts(prompt, generated),
                advantage=(g.rewards[k] - mean) / (std + 1e-6),
                version_min=vmin,
                version_max=vmax,
                staleness=max(0, step - 1 - vmin),
                length=len(generated),
            )
        )
    return out


def _turns(g: Group, row: list[int]) -> tuple[list[SampleTurn], str]:
    """Split one episode's tokens into (turns after the prompt, the prompt's text) by `token_turn`: runs of
    one turn's tokens are the policy's, runs of -1 after the prompt are tool replies."""
    segments: list[tuple[int, list[int]]] = []
    for token, turn in zip(row, g.token_turn):
        if segments and segments[-1][0] == turn:
            segments[-1][1].append(token)
        else:
            segments.append((turn, [token]))
    prompt = decode(segments[0][1]) if segments and segments[0][0] < 0 else ""
    turns: list[SampleTurn] = []
    for turn, tokens in segments[1:] if prompt else segments:
        text = decode(tokens)[:MAX_SAMPLE_TEXT]
        if turn < 0:
            turns.append(SampleTurn(role="tool", text=text))
        else:
            turns.append(
                SampleTurn(
                    role="policy",
                    text=text,
                    version=g.versions[turn],
                    engine=g.engines[turn][:MAX_SAMPLE_NAME],
                    request=g.request_ids[turn][:MAX_SAMPLE_NAME],
                )
            )
    return turns, prompt
