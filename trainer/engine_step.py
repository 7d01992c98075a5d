"""One forward step of the batching engine over the requests in its running batch (runs on the step thread).

Requests that just joined feed their whole turn (the last pending token and the new tokens, padded to the
longest joiner) in one prefill forward; requests already running feed their last sampled token in one decode
forward. Either way every request gets exactly one new token per step, sampled from its own rows with its own
generator, so a request's tokens do not depend on which requests shared its steps.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from trainer.batching import Session
from trainer.kvpool import KVPool, pooled_step
from trainer.policy import TinyTransformer


@dataclass(eq=False)
class GenRequest:
    session_id: str
    request_id: str
    version: int  # the lease's weight version: every token of the request is tagged with it
    feed: list[list[int]]  # (G, t) the pending token (if any) then this turn's new tokens
    n: int  # tokens to sample per row
    greedy: bool
    generator: torch.Generator
    future: asyncio.Future[dict[str, Any]] = field(init=False)
    session: Session | None = None  # set when the request has its pool rows
    length: int = 0  # tokens in the session's rows as this request advances them
    tokens: list[torch.Tensor] = field(default_factory=list)  # per step (G, 1)
    logps: list[torch.Tensor] = field(default_factory=list)  # per step (G, 1)
    abort_reason: str = ""

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.n


@torch.no_grad()
def run_step(model: TinyTransformer, pool: KVPool, batch: list[GenRequest], temperature: float) -> None:
    """Advance every request of `batch` by one token (joiners prefill, the others decode)."""
    joiners = [r for r in batch if not r.tokens]
    running = [r for r in batch if r.tokens and not r.done]
    if joiners:
        _advance(model, pool, joiners, [_feed_rows(r) for r in joiners], temperature)
    if running:
        _advance(
            model, pool, running, [[[int(t)] for t in r.tokens[-1].view(-1).tolist()] for r in running], temperature
        )


def _feed_rows(r: GenRequest) -> list[list[int]]:
    """A fresh session whose rows all feed the same prompt (a GRPO group) computes it once: one row."""
    if r.length == 0 and all(row == r.feed[0] for row in r.feed):
        return r.feed[:1]
    return r.feed


def _advance(
    model: TinyTransformer,
    pool: KVPool,
    requests: list[GenRequest],
    feeds: list[list[list[int]]],
    temperature: float,
) -> None:
    """One forward over the rows of `requests`, `feeds[i]` the rows request i computes (all of its rows, or
    one for a shared prompt: then its cache is copied to the other rows and its distribution used for all)."""
    device = pool.k[0].device
    width = max(len(f[0]) for f in feeds)
    rows, start, valid, tokens = [], [], [], []
    for r, feed in zip(requests, feeds):
        assert r.session is not None
        rows += r.session.rows[: len(feed)]
        start += [r.length] * len(feed)
        valid += [len(feed[0])] * len(feed)
        tokens += [row + [0] * (width - len(row)) for row in feed]
    logits = pooled_step(
        model,
        pool,
        torch.tensor(rows, device=device),
        torch.tensor(tokens, device=device),
        torch.tensor(start, device=device),
        torch.tensor(valid, device=device),
    )
    logp = F.log_softmax(logits.float() / temperature, dim=-1)  # (B, V)
    offset = 0
    for r, feed in zip(requests, feeds):
        assert r.session is not None
        g, computed = len(r.feed), len(feed)
        lp = logp[offset : offset + computed]
        offset += computed
        if computed < g:
            pool.copy_rows(r.session.rows[0], r.session.rows[1:])
            lp = lp.expand(g, lp.shape[1]).contiguous()
        tok = lp.argmax(dim=-1, keepdim=True) if r.greedy else torch.multinomial(lp.exp(), 1, generator=r.generator)
        r.tokens.append(tok)
        r.logps.append(lp.gather(1, tok))
        r.length += len(feed[0])


def request_result(request: GenRequest, engine_id: str, inflight: int) -> dict[str, Any]:
    """The answer to one generate() call: (G, n) tokens and behaviour log-probs, tagged with the lease."""
    return {
        "tokens": torch.cat(request.tokens, 1).tolist(),
        "logprobs": torch.cat(request.logps, 1).tolist(),
        "version": request.version,
        "request_id": request.request_id,
        "engine": engine_id,
        "inflight": inflight,  # the engine's load as it answered: routers balance new sessions on it
    }
