"""The engine's KV memory: one preallocated slot pool of sequence rows, and the batched forward step over it.

Every sequence row (one of a session's G samples) owns one slot of the pool: its keys and values for all
`block_size` positions, per layer `(rows, H, block_size + 1, hd)`. Column `block_size` is scratch: padding
positions write there and no query ever sees it. A forward step takes any set of rows, each with its own
cache length and its own number of new tokens (padded to the longest), and attends over the whole fixed
width with a per-row mask. Attending over a fixed width (never "the longest row in this batch") is what makes
a row's result independent of which other rows share its step: batched and one-at-a-time give the same bits
(tested in tests/trainer/test_batching.py; measured on CPU, unverified on GPU).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F

from trainer.policy import Block, TinyTransformer

# Rows of one matrix product in a step. CPU matrix products pick their kernel, and so their rounding, from the
# shapes (and the CPU): a row computed among 1, 5 or 60 others would come out different in the last bits. Every
# linear layer of a step therefore runs on chunks of exactly CHUNK_ROWS rows (zero-padded), so each row gets the
# numbers it gets alone, whoever shares its step (tests/trainer/test_batching.py). Measured on an AVX-512 Xeon
# with torch 2.13: plain products were batch-invariant only from 3 rows (64 inputs), 11 (256) or 16 (512) on.
# 64, not 16: fewer products per step (bench/engine.py at 64 sessions: 16 rows 3.8x the old engine, 64 rows 4.9x).
CHUNK_ROWS = 64


def kv_bytes_per_row(n_layer: int, d_model: int, block_size: int, element_size: int = 4) -> int:
    """Bytes of K and V one sequence row holds in the pool (all layers, full width plus the scratch column)."""
    return 2 * n_layer * (block_size + 1) * d_model * element_size


class KVPool:
    """K/V tensors for `rows` sequence rows of `model` (allocated lazily: untouched rows cost no resident memory)."""

    def __init__(self, model: TinyTransformer, rows: int, device: torch.device | str = "cpu") -> None:
        if rows < 1:
            raise ValueError("a KV pool needs at least one row")
        n_head = _blocks(model)[0].n_head
        d_model = model.tok.embedding_dim
        self.rows, self.width = rows, model.block_size
        shape = (rows, n_head, model.block_size + 1, d_model // n_head)  # (S, H, L+1, hd)
        # empty, not zeros: pages are touched only when a slot is first used (`clear` zeroes it then).
        self.k = [torch.empty(shape, device=device) for _ in model.blocks]
        self.v = [torch.empty(shape, device=device) for _ in model.blocks]
        self._kbuf: torch.Tensor | None = None  # gather() output, reused by every layer and step
        self._vbuf: torch.Tensor | None = None

    def gather(self, layer: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of `rows` at `layer`, (B, H, L+1, hd), copied into buffers kept across steps: a fresh
        multi-megabyte tensor per call costs more in page faults than the copy itself (measured 7 ms vs 0.4 ms)."""
        B = rows.shape[0]
        if self._kbuf is None or self._kbuf.shape[0] < B:
            shape = (max(B, 2 * (0 if self._kbuf is None else self._kbuf.shape[0])), *self.k[0].shape[1:])
            self._kbuf = torch.empty(shape, device=self.k[0].device)
            self._vbuf = torch.empty(shape, device=self.k[0].device)
        assert self._vbuf is not None
        keys = torch.index_select(self.k[layer], 0, rows, out=self._kbuf[:B])
        values = torch.index_select(self.v[layer], 0, rows, out=self._vbuf[:B])
        return keys, values

    def copy_rows(self, sources: list[int], targets: list[int]) -> None:
        """Row `targets[i]` gets the cache of row `sources[i]` (samples of one prompt share its prefill)."""
        device = self.k[0].device
        src, dst = torch.tensor(sources, device=device), torch.tensor(targets, device=device)
        for t in (*self.k, *self.v):
            t.index_copy_(0, dst, t.index_select(0, src))

    def clear(self, rows: list[int]) -> None:
        """Zero the slots a new session takes (masked keys are multiplied by 0: they must not be NaN)."""
        idx = torch.tensor(rows, device=self.k[0].device)
        for t in (*self.k, *self.v):
            t.index_fill_(0, idx, 0.0)


@torch.no_grad()
def pooled_step(
    model: TinyTransformer,
    pool: KVPool,
    rows: torch.Tensor,
    tokens: torch.Tensor,
    start: torch.Tensor,
    valid: torch.Tensor,
) -> torch.Tensor:
    """Feed `tokens` (B, T) to pool rows `rows` (B,) whose caches hold `start` (B,) tokens; row b's first
    `valid[b]` tokens are real, the rest padding. Writes their K/V into the pool; returns the logits after each
    row's last real token (B, V). Callers guarantee start + valid <= block_size."""
    B, T = tokens.shape
    L = pool.width
    offs = torch.arange(T, device=tokens.device)
    pos = start[:, None] + offs[None, :]  # (B, T) absolute positions
    real = offs[None, :] < valid[:, None]
    write_at = torch.where(real, pos, L)  # padding goes to the scratch column
    keys = torch.arange(L + 1, device=tokens.device)
    # Query at position p sees keys 0..p, never the scratch column. (B, 1, T, L+1)
    mask = ((keys[None, None, :] <= pos[:, :, None]) & (keys < L))[:, None]
    x = model.tok(tokens) + model.pos(pos.clamp(max=L - 1))  # (B, T, C)
    C = x.shape[2]
    blocks = _blocks(model)
    H = blocks[0].n_head
    # Where each (row, position, head) writes in the pool seen as (S*H*(L+1), hd): one index_copy_ per tensor.
    heads = torch.arange(H, device=x.device)
    flat = ((rows[:, None, None] * H + heads) * (L + 1) + write_at[:, :, None]).reshape(-1)  # (B*T*H,)
    for i, block in enumerate(blocks):
        q, k, v = _linear(block.qkv, block.ln1(x)).chunk(3, dim=2)
        pool.k[i].view(-1, C // H).index_copy_(0, flat, k.reshape(B * T * H, C // H))
        pool.v[i].view(-1, C // H).index_copy_(0, flat, v.reshape(B * T * H, C // H))
        q = q.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, hd)
        keys, values = pool.gather(i, rows)  # (B, H, L+1, hd)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + _linear(block.proj, y.transpose(1, 2).reshape(B, T, C))
        up, act, down = block.mlp
        x = x + _linear(down, act(_linear(up, block.ln2(x))))
    last = x[torch.arange(B, device=x.device), valid - 1]  # (B, C)
    return _linear(model.head, model.ln_f(last))  # (B, V)


def _linear(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`layer(x)` (a torch.nn.Linear) over x's last dimension, computed CHUNK_ROWS rows at a time."""
    assert isinstance(layer, torch.nn.Linear)
    flat = x.reshape(-1, x.shape[-1])
    m = flat.shape[0]
    padded = -(-m // CHUNK_ROWS) * CHUNK_ROWS
    if padded != m:
        flat = torch.cat([flat, flat.new_zeros(padded - m, flat.shape[1])])
    out = torch.cat([F.linear(c, layer.weight, layer.bias) for c in flat.view(-1, CHUNK_ROWS, flat.shape[1]).unbind(0)])
    return out[:m].reshape(*x.shape[:-1], out.shape[-1])


def _blocks(model: TinyTransformer) -> list[Block]:
    return [cast(Block, b) for b in model.blocks]
