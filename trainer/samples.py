"""Sample capture: which episodes of a trained batch the run posts as `sample` events, and their data.

Every step, `samples_groups_per_step` groups chosen by a seeded draw, plus (with `samples_best_worst`) the
groups with the best and the worst mean reward, each posted whole (all G episodes). Pure functions over the
batch the step just trained on; `trainer.loop` emits what `samples_capture` returns. The schema and its
limits are `trainer.sample_schema`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainer.episodes import Group, Row
from trainer.problems import VOCAB, SequenceTask
from trainer.problems import decode as task_decode
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
    """Every episode of group `g` as sample data (advantages normalized within the group, as GRPO does). A group
    an agent environment ran over HTTP (`meta["environment"]`) is in the chat vocabulary, its finish reasons are
    the session server's and its reward parts the environment's."""
    agent = bool(g.meta.get("environment"))
    decode: Callable[[list[int]], str]
    if agent:
        from agents.chat import decode as chat_decode

        decode, parts = chat_decode, g.meta.get("reward_parts") or [{}] * len(g.rows)
    else:
        decode, prompt = task_decode, task.train_prompts[g.prompt_index]
    n = len(g.rewards)
    mean = sum(g.rewards) / max(1, n)
    std = (sum((r - mean) ** 2 for r in g.rewards) / max(1, n)) ** 0.5
    versions = g.versions
    vmin, vmax = min(versions, default=step - 1), max(versions, default=step - 1)
    out: list[SampleData] = []
    for k, row in enumerate(g.rows):
        turns, prompt_text = _turns(row, decode)
        generated = row.generated()
        completion = "".join(t["text"] for t in turns if t["role"] == "policy")
        out.append(
            SampleData(
                step=step,
                group=g.group_id,
                index=k,
                prompt_index=g.prompt_index,
                session=row.session[:MAX_SAMPLE_NAME],
                engine=(row.turns[-1].engine if row.turns else "")[:MAX_SAMPLE_NAME],
                finish_reason=_finish(row, generated, agent),
                pick=pick,
                prompt=prompt_text[:MAX_SAMPLE_TEXT],
                completion=completion[:MAX_SAMPLE_TEXT],
                turns=turns[:MAX_SAMPLE_TURNS],
                reward=float(g.rewards[k]),
                reward_parts=dict(parts[k]) if agent else task.reward_parts(prompt, generated),
                advantage=(g.rewards[k] - mean) / (std + 1e-6),
                version_min=vmin,
                version_max=vmax,
                staleness=max(0, step - 1 - vmin),
                length=len(generated),
            )
        )
    return out


def _finish(row: Row, generated: list[int], agent: bool) -> str:
    if agent:
        return row.turns[-1].finish_reason if row.turns else "length"
    return "stop" if all(VOCAB[t].isdigit() for t in generated) else "length"


def _turns(row: Row, decode: Callable[[list[int]], str]) -> tuple[list[SampleTurn], str]:
    """Split one episode into (turns after the prompt, the prompt's text) by its `turns`: each generated span is
    a policy turn, the fed tokens before the first are the prompt, fed tokens after a turn are a tool reply."""
    turns: list[SampleTurn] = []
    prompt = decode(row.tokens[: row.turns[0].start]) if row.turns else decode(row.tokens)
    for i, turn in enumerate(row.turns):
        turns.append(
            SampleTurn(
                role="policy",
                text=decode(row.tokens[turn.start : turn.end])[:MAX_SAMPLE_TEXT],
                version=row.versions[turn.start],
                engine=turn.engine[:MAX_SAMPLE_NAME],
                request=turn.request_id[:MAX_SAMPLE_NAME],
            )
        )
        fed_end = row.turns[i + 1].start if i + 1 < len(row.turns) else len(row.tokens)
        if fed_end > turn.end:
            turns.append(SampleTurn(role="tool", text=decode(row.tokens[turn.end : fed_end])[:MAX_SAMPLE_TEXT]))
    return turns, prompt
