"""`digits` over HTTP: continue an arithmetic progression mod N in one reply (the trainer's `digits` task, the
same (a, d) pairs and held-out split for the same seed, spoken as a chat).

The user message is the shown terms (`"3579"` for 3, 5, 7, 9 mod 10); the reply is the next `answer_terms` terms
(`"135"`). As in process (trainer/problems.py `DigitTask`), a reply is exactly the answer's length in tokens
(`max_tokens`; it ends earlier only if the policy samples `<|end|>`), and is scored on those tokens alone:
reward, the share of characters right before the first wrong one; exact, all of them right. No `<|end|>` is asked
for after the answer: no reward pays for one, and asking for it kept greedy exact-match at 0 while the digits
themselves were learned."""

from __future__ import annotations

import random
from typing import Any

from agents.chat import encode
from agents.environments import Environment, EpisodeResult, OneTurn, Split, Task

DIGIT_BIAS = {str(encode(c)[0]): 100 for c in "0123456789"}


def progression_tasks(
    seed: int, *, modulus: int = 10, terms: tuple[int, int] = (3, 5), answer_terms: int = 3, held_out: float = 0.2
) -> dict[str, list[Task]]:
    """The tasks of both splits: (a, d) pairs shuffled by `seed`, the first `held_out` share held out."""
    width = len(str(modulus - 1))
    pairs = [(a, d) for a in range(modulus) for d in range(modulus)]
    random.Random(seed).shuffle(pairs)
    n_held = int(round(len(pairs) * held_out))
    split_pairs = {"held_out": sorted(pairs[:n_held]), "train": sorted(pairs[n_held:])}
    out: dict[str, list[Task]] = {}
    for split, chosen in split_pairs.items():
        tasks: list[Task] = []
        for a, d in chosen:
            for shown in range(terms[0], terms[1] + 1):
                seq = [str((a + k * d) % modulus).zfill(width) for k in range(shown + answer_terms)]
                text = "".join(seq[:shown])
                tasks.append(
                    Task(len(tasks), ({"role": "user", "content": text},), "".join(seq[shown:]), {"a": a, "d": d})
                )
        out[split] = tasks
    return out


def prefix_score(want: str, got: str) -> tuple[float, float]:
    """(share of characters right before the first wrong one, 1.0 when all right and nothing extra)."""
    right = 0
    for w, g in zip(want, got):
        if w != g:
            break
        right += 1
    return right / len(want), float(got == want)


class DigitsEnvironment(Environment):
    name = "digits"
    max_turns = 1
    runs_groups = True  # one turn: a group is one request with n choices

    def __init__(
        self, seed: int = 0, *, modulus: int = 10, answer_terms: int = 3, constrain: bool = True, **options: Any
    ) -> None:
        super().__init__(seed, **options)
        self.logit_bias = DIGIT_BIAS if constrain else None
        self.modulus, self.answer_terms = modulus, answer_terms
        self._tasks = progression_tasks(seed, modulus=modulus, answer_terms=answer_terms)
        self.max_tokens = answer_terms * len(str(modulus - 1))  # the answer's length, as DigitTask.turn_len

    def tasks(self, split: Split) -> list[Task]:
        return self._tasks[split]

    def one_turn(self, task: Task) -> OneTurn:
        return OneTurn(task.messages, self.max_tokens, self.logit_bias)

    async def run_episode(self, client: Any, session_id: str, task: Task, *, model: str = "policy") -> EpisodeResult:
        [result] = await self.run_group(client, session_id, task, 1, model=model)
        return result

    def score_reply(self, task: Task, reply: str) -> EpisodeResult:
        reward, exact = prefix_score(task.answer, reply)
        width = len(str(self.modulus - 1))
        parts = {
            f"term_{i + 1}": float(reply[i * width : (i + 1) * width] == task.answer[i * width : (i + 1) * width])
            for i in range(self.answer_terms)
        }
        return EpisodeResult(reward=reward, exact=exact, parts=parts, turns=1)
