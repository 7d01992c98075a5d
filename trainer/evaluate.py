"""Greedy evaluation of a policy on training or held-out prompts (batched, with the KV cache)."""

from __future__ import annotations

from collections import defaultdict

import torch

from trainer.engine_step import bias_vector
from trainer.policy import TinyTransformer, sample_tokens
from trainer.problems import Prompt, SequenceTask


@torch.no_grad()
def evaluate(model: TinyTransformer, task: SequenceTask, prompts: list[Prompt]) -> dict[str, float]:
    """Mean reward and exact-match of greedy answers; prompts of equal length run as one batch per turn."""
    was_training = model.training
    model.eval()
    buckets: dict[int, list[Prompt]] = defaultdict(list)
    for p in prompts:
        buckets[p.shown].append(p)
    device = next(model.parameters()).device
    reward = exact = 0.0
    for bucket in buckets.values():
        feed = torch.tensor([task.prompt_tokens(p) for p in bucket], device=device)  # (n, P)
        cache = None
        generated: list[list[int]] = [[] for _ in bucket]
        for turn in range(task.turns):
            toks, _, cache, pending = sample_tokens(
                model, feed, cache, task.turn_len(), temperature=1.0, generator=None, greedy=True
            )
            for row, t in enumerate(toks.tolist()):
                generated[row] += t
            replies = [task.tool_reply(p, turn, generated[row]) for row, p in enumerate(bucket)]
            if replies[0]:
                feed = torch.cat([pending, torch.tensor(replies, device=device)], dim=1)
        for p, g in zip(bucket, generated):
            r, e = task.score(p, g)
            reward += r
            exact += e
    model.train(was_training)
    n = max(1, len(prompts))
    return {"reward": reward / n, "exact_match": exact / n}


def eval_prompts(prompts: list[Prompt], n: int) -> list[Prompt]:
    """A fixed, evenly spread subset (the same every evaluation, so curves are comparable)."""
    if len(prompts) <= n:
        return list(prompts)
    stride = len(prompts) / n
    return [prompts[int(i * stride)] for i in range(n)]


# One one-turn request, as the driver sends it to the learner: prompt ids, max_tokens, logit_bias (id, bias) pairs.
OneTurnRequest = tuple[list[int], int, list[tuple[int, float]]]


@torch.no_grad()
def greedy_replies(
    model: TinyTransformer, requests: list[OneTurnRequest], stop: int, temperature: float
) -> list[list[int]]:
    """Greedy replies to one-turn requests, each cut before its first `stop` token, as the engine answers a
    one-row chat request; requests of the same shape run as one batch. ValueError for a request that does not fit
    the model's context (the session server's 400), before the model is touched."""
    buckets: dict[tuple[int, int, tuple[tuple[int, float], ...]], list[int]] = defaultdict(list)
    for i, (prompt, max_tokens, pairs) in enumerate(requests):
        if not prompt or max_tokens < 1 or len(prompt) + max_tokens - 1 > model.block_size:
            raise ValueError(f"request {i}: {len(prompt)} prompt tokens and max_tokens {max_tokens} do not fit")
        buckets[(len(prompt), max_tokens, tuple(pairs))].append(i)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    vocab = model.head.out_features
    out: list[list[int]] = [[] for _ in requests]
    for (_, n, bias), rows in buckets.items():
        vector = bias_vector(bias, vocab)
        add = None if vector is None else vector.to(device)
        feed = torch.tensor([requests[i][0] for i in rows], device=device)
        toks, *_ = sample_tokens(model, feed, None, n, temperature=temperature, generator=None, greedy=True, bias=add)
        for i, ids in zip(rows, toks.tolist()):
            out[i] = ids[: ids.index(stop)] if stop in ids else ids
    model.train(was_training)
    return out
