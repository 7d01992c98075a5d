"""One forward step of the batching engine over the requests in its running batch (runs on the step thread).

Requests that just joined feed their whole turn (the last pending token and the new tokens, padded to the
longest joiner) in one prefill forward; requests already running feed their last sampled token in one decode
forward. Either way every request gets exactly one new token per step. Sampling is torch.multinomial's own
exponential race (argmax of p / E, E ~ Exp(1), drawn from the request's generator, seeded by the request's
seed): bit for bit what `torch.multinomial(p, 1, generator)` draws, batched, so a request's tokens depend on its
seed and its own rows only, never on which requests shared its steps. (An inverse-CDF sampler against uniforms
drawn up front, correct in every marginal we tested, trained the digits task about twice as slowly per step on
each of 3 seeds: docs/trainer.md, "Held-out bisect".)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from trainer.batching import Session
from trainer.kvpool import CHUNK_ROWS, KVPool, pooled_step, row_span
from trainer.policy import TinyTransformer

# A prefill forward feeds at least this many positions (padding): attention over 1-3 query positions takes
# another CPU kernel than over 4 or more, so a short turn would round differently depending on whether a longer
# one shares its step. Decode forwards always feed exactly one position.
MIN_PREFILL = 4


@dataclass(eq=False)
class GenRequest:
    session_id: str
    request_id: str
    version: int  # the lease's weight version: every token of the request is tagged with it
    feed: list[list[int]]  # (G, t) the pending token (if any) then this turn's new tokens
    n: int  # tokens to sample per row
    greedy: bool
    generator: torch.Generator | None  # seeded by the request's seed; None when greedy
    future: asyncio.Future[dict[str, Any]] = field(init=False)
    session: Session | None = None  # set when the request has its pool rows
    length: int = 0  # tokens in the session's rows as this request advances them
    tokens: list[torch.Tensor] = field(default_factory=list)  # per step (G, 1)
    logps: list[torch.Tensor] = field(default_factory=list)  # per step (G, 1)
    abort_reason: str = ""
    last: bool = False  # the episode's final turn: the session ends when it is answered
    stop: frozenset[int] = frozenset()  # token ids that end the (one-row) request when sampled, kept in its tokens
    stopped: bool = False  # it sampled a stop token
    bias: torch.Tensor | None = None  # (V,) added to every row's logits / temperature (the request's logit_bias)

    @property
    def done(self) -> bool:
        return self.stopped or len(self.tokens) >= self.n


def request_generator(seed: int, greedy: bool) -> torch.Generator | None:
    """The generator one request samples with, from its seed alone (none for a greedy request)."""
    return None if greedy else torch.Generator().manual_seed(seed)


def race_noise(requests: list[GenRequest], vocab: int) -> torch.Tensor:
    """(sum G, vocab) float64 Exp(1) noise, each request's rows from its own generator, in the order
    torch.multinomial draws them (greedy rows get ones: their token is the argmax anyway)."""
    parts = [
        torch.ones(len(r.feed), vocab, dtype=torch.float64)
        if r.generator is None
        else torch.empty(len(r.feed), vocab, dtype=torch.float64).exponential_(generator=r.generator)
        for r in requests
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def run_step(model: TinyTransformer, pool: KVPool, batch: list[GenRequest], temperature: float) -> None:
    """Advance every request of `batch` by one token (joiners prefill, the others decode)."""
    joiners = [r for r in batch if not r.tokens]
    running = [r for r in batch if r.tokens and not r.done]
    device = pool.k[0].device
    if joiners:
        feeds = [_feed_rows(r) for r in joiners]
        width = max(MIN_PREFILL, *(len(f[0]) for f in feeds))
        padded = [row + [0] * (width - len(row)) for f in feeds for row in f]
        _advance(model, pool, joiners, [len(f) for f in feeds], torch.tensor(padded, device=device), temperature)
    if running:
        last = torch.cat([r.tokens[-1] for r in running]) if len(running) > 1 else running[0].tokens[-1]  # (B, 1)
        _advance(model, pool, running, [len(r.feed) for r in running], last, temperature)


def step_positions(r: GenRequest) -> int:
    """Token positions the next step feeds for `r` (what its step's cost grows with)."""
    if r.tokens:
        return len(r.feed)
    rows = _feed_rows(r)
    return len(rows) * max(MIN_PREFILL, len(rows[0]))


def step_chunks(r: GenRequest) -> int:
    """16-row chunks the next step multiplies for `r` (trainer/kvpool.py CHUNK_ROWS): what a small step's cost
    grows with. Profiled at one session, a prefill of 6 positions and a decode of 8 rows cost the same (both one
    padded chunk); predicting per position made every decode look 8/6 as dear as the prefill it followed."""
    return -(-step_positions(r) // CHUNK_ROWS)


def _feed_rows(r: GenRequest) -> list[list[int]]:
    """A fresh session whose rows all feed the same prompt (a GRPO group) computes it once: one row."""
    if r.length == 0 and r.feed.count(r.feed[0]) == len(r.feed):
        return r.feed[:1]
    return r.feed


def _advance(
    model: TinyTransformer,
    pool: KVPool,
    requests: list[GenRequest],
    computed: list[int],
    tokens: torch.Tensor,
    temperature: float,
) -> None:
    """One forward over `computed[i]` rows of request i (all of its rows, or its first one for a shared prompt:
    then that row's cache is copied to the others and its distribution serves all of them), then one token per
    row. `tokens` (sum(computed), T) padded; every row of request i feeds the same number of real tokens."""
    device = tokens.device
    rows: list[int] = []
    start: list[int] = []
    valid: list[int] = []
    expand: list[int] = []  # output row -> computed row (a shared prompt's rows all read its one row)
    greedy: list[bool] = []
    sources: list[int] = []
    targets: list[int] = []
    for r, c in zip(requests, computed):
        assert r.session is not None
        g, fed = len(r.feed), (len(r.feed[0]) if not r.tokens else 1)
        first = len(rows)
        rows += r.session.rows[:c]
        start += [r.length] * c
        valid += [fed] * c
        expand += [first + (k if c == g else 0) for k in range(g)]
        greedy += [r.greedy] * g
        if c < g:
            sources += [r.session.rows[0]] * (g - c)
            targets += r.session.rows[c:]
        r.length += fed
    meta = torch.tensor([rows, start, valid], device=device).unbind()  # one tensor from the lists, not three
    logits = pooled_step(model, pool, meta[0], tokens, meta[1], meta[2], row_span(rows))
    if targets:
        pool.copy_rows(sources, targets)
    scaled = logits.float() / temperature
    if len(expand) != len(rows):  # a shared prompt's rows read its one computed row
        scaled = scaled[torch.tensor(expand, device=device)]  # (B, V)
    if any(r.bias is not None for r in requests):
        scaled = scaled + _row_biases(requests, scaled.shape[1]).to(device)
    logp = F.log_softmax(scaled, dim=-1)
    tok = _pick(requests, logp, greedy)
    tok_logp = logp.gather(1, tok)  # (B, 1)
    if len(requests) == 1:  # a lone request: its rows are all of them
        requests[0].tokens.append(tok)
        requests[0].logps.append(tok_logp)
        _check_stop(requests[0])
        return
    offset = 0
    for r in requests:
        g = len(r.feed)
        r.tokens.append(tok[offset : offset + g])
        r.logps.append(tok_logp[offset : offset + g])
        _check_stop(r)
        offset += g


def bias_vector(pairs: Sequence[tuple[int, float]], vocab: int) -> torch.Tensor | None:
    """A request's logit_bias as one (V,) vector (None without one); `invalid_request` checked the pairs."""
    if not pairs:
        return None
    bias = torch.zeros(vocab)
    for token, value in pairs:
        bias[token] = value
    return bias


def _row_biases(requests: list[GenRequest], vocab: int) -> torch.Tensor:
    """(sum G, V): each row its request's bias, zeros for a request without one."""
    zeros = torch.zeros(vocab)
    return torch.stack([r.bias if r.bias is not None else zeros for r in requests for _ in r.feed])


def _pick(requests: list[GenRequest], logp: torch.Tensor, greedy: list[bool]) -> torch.Tensor:
    """One token per row (B, 1): the argmax for greedy rows, torch.multinomial(p, 1)'s draw for the others (the
    race against each request's own noise). Steps where every row is one kind skip the other's work."""
    if all(greedy):
        return logp.argmax(dim=-1, keepdim=True)
    noise = race_noise(requests, logp.shape[1]).to(logp.device)
    sampled = (logp.exp().double() / noise).argmax(dim=-1, keepdim=True)  # torch.multinomial(p, 1), exactly
    if not any(greedy):
        return sampled
    return torch.where(torch.tensor(greedy, device=logp.device)[:, None], logp.argmax(dim=-1, keepdim=True), sampled)


def _check_stop(r: GenRequest) -> None:
    """A one-row request with stop tokens is finished once it samples one (a host sync, only for such rows)."""
    if r.stop and int(r.tokens[-1].view(-1)[0]) in r.stop:
        r.stopped = True


def request_result(request: GenRequest, engine_id: str, inflight: int) -> dict[str, Any]:
    """The answer to one generate() call: (G, n) tokens and behaviour log-probs, tagged with the lease."""
    return {
        "tokens": torch.cat(request.tokens, 1).tolist(),
        "logprobs": torch.cat(request.logps, 1).tolist(),
        "version": request.version,
        "request_id": request.request_id,
        "finish_reasons": ["stop" if request.stopped else "length"] * len(request.feed),
        "engine": engine_id,
        "inflight": inflight,  # the engine's load as it answered: routers balance new sessions on it
        "ended": request.last,  # the session ended with this answer (its final turn): no end_session needed
    }


def invalid_request(
    feed: list[list[int]],
    n: int,
    cached: int,
    block_size: int,
    vocab: int,
    stop: frozenset[int] = frozenset(),
    logit_bias: Sequence[tuple[int, float]] = (),
) -> str:
    """Why a request must be refused before generation ('' if it can run)."""
    for token, value in logit_bias:
        if not (isinstance(token, int) and 0 <= token < vocab):
            return f"logit_bias token {token!r} outside the vocabulary"
        if not (isinstance(value, int | float) and -100 <= value <= 100):
            return f"logit_bias of token {token} must be in [-100, 100], got {value!r}"
    if not feed or not feed[0]:
        return "no rows or no tokens to feed"
    if stop and len(feed) != 1:
        return f"stop tokens are allowed only for one-row requests, got {len(feed)} rows"
    if stop and (min(stop) < 0 or max(stop) >= vocab):
        return "stop token outside the vocabulary"
    if len({len(r) for r in feed}) != 1:
        return "rows of different lengths"
    if n < 1:
        return f"n must be at least 1, got {n}"
    if min(map(min, feed)) < 0 or max(map(max, feed)) >= vocab:
        return "token outside the vocabulary"
    need = cached + len(feed[0]) + n - 1  # the last sampled token stays pending, outside the cache
    if need > block_size:
        return f"context of {need} tokens exceeds the model's {block_size}"
    return ""
