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

# Rows of one matrix product. CPU matrix products pick their kernel, and so their rounding, from the shapes (and
# the CPU): a row computed among 1, 5 or 60 others would come out different in the last bits. Every linear layer
# of a step therefore multiplies chunks of exactly CHUNK_ROWS rows (zero-padded), all chunks in one batched
# product (`torch.baddbmm`, one fixed-shape product per chunk), so each row gets the numbers it gets alone,
# whoever shares its step (tests/trainer/test_batching.py). Measured on an AVX-512 Xeon with torch 2.13: plain
# products were batch-invariant only from 3 rows (64 inputs), 11 (256) or 16 (512) on. 16, not 64: a lone
# session's step (8 rows decoding, or one prompt row prefilling) pads to 16 rows, not 64; the batched product
# keeps the many chunks of a full step one call (bench/engine.py, docs/trainer.md "Measured").
CHUNK_ROWS = 16


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
        # Constants of every step: the key positions (the scratch column's is past every query position, so the
        # causal comparison alone masks it), the head numbers, and the model's parameters as the step uses them.
        key_pos = torch.arange(model.block_size + 1, device=device)
        key_pos[-1] = 1 << 30
        query_pos = torch.arange(model.block_size, device=device)[:, None]
        # causal[p]: the additive mask of a query at position p over the whole width, (L, L+1): 0 where it sees
        # the key (keys 0..p), -inf elsewhere. A step's mask is one lookup into it.
        self.causal = torch.tensor([float("-inf"), 0.0], device=device)[(key_pos <= query_pos).long()]
        self.heads = torch.arange(n_head, device=device)
        self.weights = StepWeights(model)

    def gather(self, layer: int, rows: torch.Tensor, span: slice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of `rows` at `layer`, (B, H, L+1, hd): when they are the pool rows `span` (side by side), a view;
        else copied into buffers kept across steps: a fresh multi-megabyte tensor per call costs more in page
        faults than the copy itself (measured 7 ms vs 0.4 ms)."""
        if span is not None:
            return self.k[layer][span], self.v[layer][span]
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
        span = row_span(targets)
        one = len(set(sources)) == 1
        if span is not None and one and not span.start <= sources[0] < span.stop:  # a prompt's rows, side by side
            for t in (*self.k, *self.v):
                t[span].copy_(t[sources[0]])
            return
        device = self.k[0].device
        src, dst = torch.tensor(sources, device=device), torch.tensor(targets, device=device)
        for t in (*self.k, *self.v):
            t.index_copy_(0, dst, t.index_select(0, src))

    def clear(self, rows: list[int]) -> None:
        """Zero the slots a new session takes (masked keys are multiplied by 0: they must not be NaN)."""
        span = row_span(rows)
        if span is not None:  # rows are handed out lowest first: usually side by side
            for t in (*self.k, *self.v):
                t[span].zero_()
            return
        idx = torch.tensor(rows, device=self.k[0].device)
        for t in (*self.k, *self.v):
            t.index_fill_(0, idx, 0.0)


def row_span(rows: list[int]) -> slice | None:
    """`rows` as a slice when they are consecutive and ascending."""
    if rows and rows[-1] - rows[0] == len(rows) - 1 and rows == list(range(rows[0], rows[-1] + 1)):
        return slice(rows[0], rows[-1] + 1)
    return None


Linear = tuple[torch.Tensor, torch.Tensor | None]  # (weight expanded to (chunks, in, out), bias)


class StepWeights:
    """The model's parameters as `pooled_step` uses them, looked up once: per block its two layer norms and its
    four linear layers as (weight transposed to (in, out), bias), and the final norm and head. Views, not copies:
    an install's load_state_dict copies new weights into the same tensors, so these stay current."""

    def __init__(self, model: TinyTransformer) -> None:
        def lin(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
            assert isinstance(layer, torch.nn.Linear)
            return layer.weight.t(), layer.bias

        def norm(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, float]:
            assert isinstance(layer, torch.nn.LayerNorm) and layer.weight is not None and layer.bias is not None
            return layer.weight, layer.bias, layer.eps

        blocks = _blocks(model)
        for b in blocks:
            act = b.mlp[1]
            assert isinstance(act, torch.nn.GELU) and act.approximate == "none", "the step computes exact GELU"
        self.tok, self.pos, self.n_head = model.tok.weight, model.pos.weight, blocks[0].n_head
        self.norms = [(norm(b.ln1), norm(b.ln2)) for b in blocks]
        self.ln_f = norm(model.ln_f)
        self._linears = [lin(b.qkv) for b in blocks] + [lin(b.proj) for b in blocks]
        self._linears += [lin(b.mlp[0]) for b in blocks] + [lin(b.mlp[2]) for b in blocks] + [lin(model.head)]
        self._chunked: dict[int, list[tuple[torch.Tensor, torch.Tensor | None]]] = {}

    def linears(self, n: int) -> tuple[list[tuple[Linear, Linear, Linear, Linear]], Linear]:
        """The linear layers for `n` chunks, weights expanded to (n, in, out) (views, made once per `n`): per
        block (qkv, proj, up, down), and the head."""
        if n not in self._chunked:
            self._chunked[n] = [(w.expand(n, *w.shape), b) for w, b in self._linears]
        lins, k = self._chunked[n], len(self.norms)
        return list(zip(lins[:k], lins[k : 2 * k], lins[2 * k : 3 * k], lins[3 * k : 4 * k])), lins[-1]


@torch.no_grad()
def pooled_step(
    model: TinyTransformer,
    pool: KVPool,
    rows: torch.Tensor,
    tokens: torch.Tensor,
    start: torch.Tensor,
    valid: torch.Tensor,
    span: slice | None = None,
) -> torch.Tensor:
    """Feed `tokens` (B, T) to pool rows `rows` (B,) whose caches hold `start` (B,) tokens; row b's first
    `valid[b]` tokens are real, the rest padding. Writes their K/V into the pool; returns the logits after each
    row's last real token (B, V). Callers guarantee start + valid <= block_size. `model`'s parameters are read
    through `pool.weights` (the same tensors). `span`: `rows` as a slice, when they are side by side.

    The residual stream is kept in chunks, (n, CHUNK_ROWS, C) with the B*T positions zero-padded to whole
    chunks, from the embedding to the last layer: layer norms, products and activations work row by row, so the
    padding rows ride along and only attention looks at the (B, T) structure."""
    w = pool.weights
    B, T = tokens.shape
    M, L, H = B * T, pool.width, w.n_head
    if T == 1:  # a decode step: one real token per row
        pos = write_at = start[:, None]  # (B, 1) absolute positions
    else:
        offs = torch.arange(T, device=tokens.device)
        pos = start[:, None] + offs  # (B, T)
        write_at = torch.where(offs < valid[:, None], pos, L)  # padding goes to the scratch column
    # Query at position p sees keys 0..p, never the scratch column (its key position is past every query's);
    # a padding query past the last position sees what the last position sees. An additive mask, made once per
    # step: what attention would make of a boolean one in every layer.
    pos = pos.clamp(max=L - 1)
    mask = pool.causal[pos][:, None]  # (B, 1, T, L+1)
    x = _chunks((torch.embedding(w.tok, tokens) + torch.embedding(w.pos, pos)).view(M, -1))  # (n, R, C)
    C = x.shape[2]
    hd = C // H
    # Where each (row, position, head) writes in the pool seen as (S*H*(L+1), hd): one index_copy_ per tensor.
    flat = ((rows[:, None, None] * H + pool.heads) * (L + 1) + write_at[:, :, None]).view(-1)  # (B*T*H,)
    blocks, head = w.linears(x.shape[0])
    for i, ((ln1, ln2), (qkv_w, proj_w, up_w, down_w)) in enumerate(zip(w.norms, blocks)):
        qkv = _linear(qkv_w, torch.layer_norm(x, (C,), *ln1)).view(-1, 3 * C)[:M]  # (M, 3C)
        pool.k[i].view(-1, hd).index_copy_(0, flat, qkv[:, C : 2 * C].reshape(M * H, hd))
        pool.v[i].view(-1, hd).index_copy_(0, flat, qkv[:, 2 * C :].reshape(M * H, hd))
        q = qkv[:, :C].view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
        keys, values = pool.gather(i, rows, span)  # (B, H, L+1, hd)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + _linear(proj_w, _chunks(y.transpose(1, 2).reshape(M, C)))
        x = x + _linear(down_w, F.gelu(_linear(up_w, torch.layer_norm(x, (C,), *ln2))))
    if T > 1:  # each row's last real position (a decode step's rows already are their last positions)
        x = _chunks(x.view(-1, C)[torch.arange(0, M, T, device=x.device) + valid - 1])  # (B in chunks, C)
        head = w.linears(x.shape[0])[1]
    return _linear(head, torch.layer_norm(x, (C,), *w.ln_f)).view(-1, head[0].shape[2])[:B]  # (B, V)


def _chunks(x: torch.Tensor) -> torch.Tensor:
    """(m, C) -> (chunks, CHUNK_ROWS, C), the rows that fill the last chunk zero."""
    extra = -x.shape[0] % CHUNK_ROWS
    return (torch.constant_pad_nd(x, (0, 0, 0, extra)) if extra else x).view(-1, CHUNK_ROWS, x.shape[1])


def _linear(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    """A linear layer over x (chunks, CHUNK_ROWS, in): one fixed-shape product per chunk, all in one call."""
    weight, bias = layer
    return torch.bmm(x, weight) if bias is None else torch.baddbmm(bias, x, weight)


def _blocks(model: TinyTransformer) -> list[Block]:
    return [cast(Block, b) for b in model.blocks]
