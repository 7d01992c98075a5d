"""Weights that make the real policy say a chosen text: test support, not a fake (the engine runs them as any
other weights, through install_version).

Under `scripted_weights` every block adds nothing to the residual stream (its output projections are zero)
and token embeddings are zero, so the stream at position p is the position embedding e_p (one-hot; needs
block_size <= d_model); the head maps LayerNorm(e_p) to the token `next_at(p)`, with a margin of `scale`
logits: greedy and sampled generation both emit it (its probability is ~1)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer.config import TrainConfig
from trainer.policy import build_policy
from trainer.problems import policy_shape


def scripted_weights(cfg: TrainConfig, next_at: Callable[[int], int], scale: float = 40.0) -> dict[str, torch.Tensor]:
    vocab, block = policy_shape(cfg)
    d = cfg.d_model
    assert block <= d, "scripted weights need one residual dimension per position"
    state = {k: v.clone() for k, v in build_policy(cfg, vocab, block).state_dict().items()}
    for key in state:
        if key.endswith(("proj.weight", "proj.bias", "mlp.2.weight", "mlp.2.bias")):
            state[key].zero_()
    state["tok.weight"].zero_()
    state["pos.weight"].zero_()
    state["pos.weight"][:, :block] = torch.eye(block)
    state["ln_f.weight"].fill_(1.0)
    state["ln_f.bias"].zero_()
    head = torch.zeros(vocab, d)
    for p in range(block):
        e = torch.zeros(d)
        e[p] = 1.0
        v = (e - e.mean()) / torch.sqrt(e.var(unbiased=False) + 1e-5)
        head[next_at(p)] += v * (scale / d)
    state["head.weight"] = head
    return state


def saying(cfg: TrainConfig, script: dict[int, list[int]], default: int) -> dict[str, torch.Tensor]:
    """Weights that, after a context of `length` tokens (a key of `script`), emit `script[length]` then
    `default` (a context length not in the script emits `default` at once)."""
    at: dict[int, int] = {}
    for length, ids in script.items():
        for i, tid in enumerate(ids):
            at[length - 1 + i] = tid
    return scripted_weights(cfg, lambda p: at.get(p, default))
