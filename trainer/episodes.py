"""One group of G episodes: what it records (tokens, behaviour log-probs, version and request id per token)
and how it is run turn by turn against any `generate` function (an engine actor, or a local engine)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from trainer.problems import Prompt, SequenceTask

# generate(session_id, new_tokens (G rows), n, seed, request_id, greedy, continues, last)
#   -> {"tokens", "logprobs", "version", "engine", ...}; `last`: the final turn (the engine then ends the session)
GenerateFn = Callable[..., Awaitable[dict[str, Any]]]


@dataclass
class GroupTicket:
    """A unit of work handed out by the sampler; rebuffered tickets are re-run with the same identity."""

    group_id: int  # global group count at hand-out: unique and stable across resume
    epoch: int
    prompt_index: int


@dataclass
class Group:
    group_id: int
    epoch: int
    prompt_index: int
    tokens: list[list[int]]  # (G, L) full episode: prompt, generated turns, tool replies
    logprobs: list[list[float]]  # (G, L) behaviour log-prob of each generated token, 0.0 elsewhere
    token_turn: list[int]  # (L,) turn that generated the token at this position, -1 for prompt/tool tokens
    versions: list[int]  # per turn: weight version of the engine that served the request
    request_ids: list[str]  # per turn
    engines: list[str]  # per turn
    rewards: list[float]  # (G,)
    exact: list[float]  # (G,)
    filtered: str = ""  # why the rollout filter dropped it ("" = kept)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def sample_ids(self) -> list[str]:
        return [f"g{self.group_id}-s{k}" for k in range(len(self.tokens))]

    @property
    def min_version(self) -> int:
        return min(self.versions)

    def token_versions(self) -> list[int]:
        return [self.versions[t] if t >= 0 else -1 for t in self.token_turn]

    def token_request_ids(self) -> list[str]:
        return [self.request_ids[t] if t >= 0 else "" for t in self.token_turn]


def generation_seed(seed: int, group_id: int, turn: int) -> int:
    """Sampling seed of one group-turn: the same tokens come out whichever engine or worker serves it."""
    return (seed * 1_000_003 + group_id * 7919 + turn * 104_729) % (2**63 - 1)


async def run_group(
    task: SequenceTask,
    ticket: GroupTicket,
    prompt: Prompt,
    *,
    group_size: int,
    seed: int,
    generate: GenerateFn,
    session_id: str,
    greedy: bool = False,
) -> Group:
    """Run G parallel episodes of one prompt as one session; each turn is one generation request."""
    first = task.prompt_tokens(prompt)
    tokens = [list(first) for _ in range(group_size)]
    logprobs = [[0.0] * len(first) for _ in range(group_size)]
    token_turn = [-1] * len(first)
    versions, request_ids, engines = [], [], []
    generated: list[list[int]] = [[] for _ in range(group_size)]
    new_tokens = [list(first) for _ in range(group_size)]
    for turn in range(task.turns):
        request_id = f"{session_id}/t{turn}"
        seed_t = generation_seed(seed, ticket.group_id, turn)
        # turn > 0 continues the session: an engine without its cache answers SessionGoneError
        last = turn == task.turns - 1
        out = await generate(session_id, new_tokens, task.turn_len(), seed_t, request_id, greedy, turn > 0, last)
        versions.append(out["version"])
        request_ids.append(request_id)
        engines.append(out["engine"])
        for row in range(group_size):
            tokens[row] += out["tokens"][row]
            logprobs[row] += out["logprobs"][row]
            generated[row] += out["tokens"][row]
        token_turn += [turn] * task.turn_len()
        reply = task.tool_reply(prompt, turn, generated[0])
        if reply:
            if task.tool_latency_s:
                await asyncio.sleep(task.tool_latency_s)  # the tool call; other episodes run meanwhile
            for row in range(group_size):
                tokens[row] += reply
                logprobs[row] += [0.0] * len(reply)
            token_turn += [-1] * len(reply)
            new_tokens = [list(reply) for _ in range(group_size)]
    scores = [task.score(prompt, generated[row]) for row in range(group_size)]
    return Group(
        group_id=ticket.group_id,
        epoch=ticket.epoch,
        prompt_index=ticket.prompt_index,
        tokens=tokens,
        logprobs=logprobs,
        token_turn=token_turn,
        versions=versions,
        request_ids=request_ids,
        engines=engines,
        rewards=[s[0] for s in scores],
        exact=[s[1] for s in scores],
    )
