"""The problems a run trains on (`TrainConfig.task`), generated in code: digit completion and a multi-turn
agent task, pluggable by name in `TASKS`.

Both continue an arithmetic sequence a, a+d, a+2d, ... modulo N written in a character vocabulary. `digits`
writes all answer terms in one generation; `agent` predicts one term per turn and a tool answers with the
true term between turns (after `tool_latency_s`), so every turn is a separate request to an engine.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agents.envs.digits import prefix_score

if TYPE_CHECKING:
    from trainer.config import TrainConfig

VOCAB = "0123456789>^"
STOI = {ch: i for i, ch in enumerate(VOCAB)}
BOS, TURN = STOI["^"], STOI[">"]


def episode_block_size(modulus: int, prompt_terms_max: int, answer_terms: int) -> int:
    """Longest episode in tokens: BOS, the shown terms, '>', then per answer term the term and a tool reply."""
    width = len(str(modulus - 1))
    return 1 + prompt_terms_max * width + 1 + answer_terms * (2 * width + 1)


def encode(text: str) -> list[int]:
    return [STOI[ch] for ch in text]


def decode(tokens: list[int]) -> str:
    return "".join(VOCAB[t] for t in tokens)


@dataclass(frozen=True)
class Prompt:
    start: int
    diff: int
    shown: int  # terms shown in the prompt

    def term(self, k: int, modulus: int) -> int:
        return (self.start + k * self.diff) % modulus


class SequenceTask:
    """Shared data and scoring; subclasses fix how the answer is split into turns."""

    name = "base"

    def __init__(
        self,
        *,
        modulus: int,
        prompt_terms_min: int,
        prompt_terms_max: int,
        answer_terms: int,
        held_out_fraction: float,
        seed: int,
        tool_latency_s: float = 0.0,
    ) -> None:
        self.modulus, self.answer_terms, self.tool_latency_s = modulus, answer_terms, tool_latency_s
        self.width = len(str(modulus - 1))
        self.shown_range = (prompt_terms_min, prompt_terms_max)
        pairs = [(a, d) for a in range(modulus) for d in range(modulus)]
        random.Random(seed).shuffle(pairs)
        n_held = int(round(len(pairs) * held_out_fraction))
        held, train = sorted(pairs[:n_held]), sorted(pairs[n_held:])
        shown = range(prompt_terms_min, prompt_terms_max + 1)
        self.train_prompts = [Prompt(a, d, k) for a, d in train for k in shown]
        self.held_out_prompts = [Prompt(a, d, k) for a, d in held for k in shown]
        self.vocab_size = len(VOCAB)

    # --- layout of one episode ---
    turns: int = 1

    def turn_len(self) -> int:
        raise NotImplementedError

    def block_size(self) -> int:
        return episode_block_size(self.modulus, self.shown_range[1], self.answer_terms)

    def fmt(self, value: int) -> str:
        return str(value).zfill(self.width)

    def prompt_tokens(self, p: Prompt) -> list[int]:
        return [BOS] + encode("".join(self.fmt(p.term(k, self.modulus)) for k in range(p.shown))) + [TURN]

    def answer_text(self, p: Prompt) -> str:
        return "".join(self.fmt(p.term(p.shown + k, self.modulus)) for k in range(self.answer_terms))

    def tool_reply(self, p: Prompt, turn: int, generated: list[int]) -> list[int]:
        """Tokens the environment appends after `turn` (none after the last turn)."""
        return []

    def score(self, p: Prompt, generated: list[int]) -> tuple[float, float]:
        """(reward, exact_match) of the concatenated generated tokens of all turns."""
        raise NotImplementedError

    def reward_parts(self, p: Prompt, generated: list[int]) -> dict[str, float]:
        """The reward's parts by name, for inspection (sample events); {} when the reward has none."""
        return {}


class DigitTask(SequenceTask):
    """Write the next `answer_terms` terms at once; partial credit up to the first wrong character."""

    name = "digits"
    turns = 1

    def turn_len(self) -> int:
        return self.answer_terms * self.width

    def score(self, p: Prompt, generated: list[int]) -> tuple[float, float]:
        return prefix_score(self.answer_text(p), decode(generated))

    def reward_parts(self, p: Prompt, generated: list[int]) -> dict[str, float]:
        """Per answer term: 1 when the term is right (the reward is the right prefix, in characters)."""
        want, got, w = self.answer_text(p), decode(generated), self.width
        return {
            f"term_{i + 1}": float(got[i * w : (i + 1) * w] == want[i * w : (i + 1) * w])
            for i in range(self.answer_terms)
        }


class AgentTask(SequenceTask):
    """One term per turn; a tool then reveals the true term. Reward: share of turns right (verifiable)."""

    name = "agent"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.turns = self.answer_terms

    def turn_len(self) -> int:
        return self.width

    def tool_reply(self, p: Prompt, turn: int, generated: list[int]) -> list[int]:
        if turn + 1 >= self.turns:
            return []
        return encode(self.fmt(p.term(p.shown + turn, self.modulus))) + [TURN]

    def score(self, p: Prompt, generated: list[int]) -> tuple[float, float]:
        got, want = decode(generated), self.answer_text(p)
        w = self.width
        hits = [got[i * w : (i + 1) * w] == want[i * w : (i + 1) * w] for i in range(self.turns)]
        return sum(hits) / self.turns, float(all(hits))

    def reward_parts(self, p: Prompt, generated: list[int]) -> dict[str, float]:
        """Per turn: 1 when that turn's term is right (the reward is their mean)."""
        got, want, w = decode(generated), self.answer_text(p), self.width
        return {
            f"turn_{i + 1}": float(got[i * w : (i + 1) * w] == want[i * w : (i + 1) * w]) for i in range(self.turns)
        }


TASKS: dict[str, Callable[..., SequenceTask]] = {"digits": DigitTask, "agent": AgentTask}


def policy_shape(cfg: TrainConfig) -> tuple[int, int]:
    """(vocab_size, block_size) of the policy a run builds: its task's, or with an agent `environment` the chat
    vocabulary (agents/chat.py) and `context_tokens` positions."""
    if cfg.environment:
        from agents.chat import VOCAB_SIZE

        return VOCAB_SIZE, cfg.context_tokens
    task = task_build(cfg)
    return task.vocab_size, task.block_size()


def task_build(cfg: TrainConfig) -> SequenceTask:
    """The task a TrainConfig names (plugins: add a class to TASKS)."""
    try:
        cls = TASKS[cfg.task]
    except KeyError:
        raise ValueError(f"task: unknown task {cfg.task!r} (known: {sorted(TASKS)})") from None
    return cls(
        modulus=cfg.modulus,
        prompt_terms_min=cfg.prompt_terms_min,
        prompt_terms_max=cfg.prompt_terms_max,
        answer_terms=cfg.answer_terms,
        held_out_fraction=cfg.held_out_fraction,
        seed=cfg.seed,
        tool_latency_s=cfg.tool_latency_s,
    )
