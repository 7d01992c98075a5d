"""The policy: a tiny decoder-only transformer with an incremental KV cache, and sampling with log-probs."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

if TYPE_CHECKING:
    from trainer.config import TrainConfig

# One (k, v) pair per layer, each (B, H, T, hd).
KVCache = list[tuple[torch.Tensor, torch.Tensor]]


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(
        self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        P = k.shape[2] - T  # tokens already in the cache
        if P == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # Query i (absolute position P+i) may see keys 0..P+i.
            mask = torch.arange(P + T, device=x.device)[None, :] <= (P + torch.arange(T, device=x.device))[:, None]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        x = x + self.mlp(self.ln2(x))
        return x, (k, v)


class TinyTransformer(nn.Module):
    def __init__(self, *, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int) -> None:
        super().__init__()
        self.block_size = block_size
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        B, T = idx.shape
        start = 0 if not cache else cache[0][0].shape[2]
        if start + T > self.block_size:
            raise ValueError(f"sequence of {start + T} tokens exceeds block_size {self.block_size}")
        x = self.tok(idx) + self.pos(torch.arange(start, start + T, device=idx.device))  # (B, T, C)
        new_cache: KVCache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, cache[i] if cache else None)
            new_cache.append(kv)
        return self.head(self.ln_f(x)), new_cache  # (B, T, V)


def build_policy(cfg: TrainConfig, vocab_size: int, block_size: int) -> TinyTransformer:
    return TinyTransformer(
        vocab_size=vocab_size, block_size=block_size, n_layer=cfg.n_layer, n_head=cfg.n_head, d_model=cfg.d_model
    )


@torch.no_grad()
def sample_tokens(
    model: TinyTransformer,
    new_tokens: torch.Tensor,
    cache: KVCache | None,
    n: int,
    *,
    temperature: float,
    generator: torch.Generator | None,
    greedy: bool = False,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, KVCache, torch.Tensor]:
    """Feed `new_tokens` (B, t) after `cache`, then sample `n` tokens; `bias` (V,), when given, is added to the
    logits / temperature (a request's logit_bias, as the engine adds it).

    Returns (tokens (B, n), log-probs (B, n) under the sampling distribution, cache, pending (B, 1)): the last
    sampled token is not yet in the cache and must lead the next call's new tokens.
    """
    feed = new_tokens
    out, logps = [], []
    for _ in range(n):
        logits, cache = model(feed, cache)
        scaled = logits[:, -1, :].float() / temperature
        logp = F.log_softmax(scaled if bias is None else scaled + bias, dim=-1)  # (B, V)
        if greedy:
            tok = logp.argmax(dim=-1, keepdim=True)
        else:
            tok = torch.multinomial(logp.exp(), 1, generator=generator)  # (B, 1)
        out.append(tok)
        logps.append(logp.gather(1, tok))
        feed = tok
    tokens, logprobs = torch.cat(out, 1), torch.cat(logps, 1)  # n == 0 fails here
    assert cache is not None  # the loop ran, and the model always returns a cache
    return tokens, logprobs, cache, feed


def sequence_logprobs(
    model: TinyTransformer, tokens: torch.Tensor, temperature: float, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and entropy of each next token: tokens (B, L) -> (B, L-1), (B, L-1); `bias` (B, L-1, V), when
    given, is added to the logits / temperature as the engine added a request's logit_bias."""
    logits, _ = model(tokens[:, :-1])
    scaled = logits.float() / temperature
    logp_all = F.log_softmax(scaled if bias is None else scaled + bias, dim=-1)  # (B, L-1, V)
    logp = logp_all.gather(2, tokens[:, 1:, None]).squeeze(2)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
