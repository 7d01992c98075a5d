"""The trainer: owns the trained policy and its optimizer, runs GRPO steps, exports weights by version.

A plain class; the Ray topology wraps it as an actor in the learner's bundle (`learner_gpus` GPUs).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from trainer.algorithm import batch_from_groups, logprob_parity, ppo_loss
from trainer.config import TrainConfig
from trainer.episodes import Group
from trainer.policy import build_policy, sequence_logprobs
from trainer.problems import policy_shape


def pick_device(requested: str, gpus: float = 0.0) -> torch.device:
    """'cuda' is CUDA; 'auto' is CUDA only when this process was given a GPU (`gpus` > 0: its bundle has one)
    and torch sees it, so logical GPUs on a machine without CUDA fall back to the CPU; else the CPU."""
    if requested == "cuda" or (requested == "auto" and gpus > 0 and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


class Learner:
    def __init__(self, cfg: TrainConfig, *, gpus: float = 0.0) -> None:
        self.cfg = cfg
        self.device = pick_device(cfg.device, gpus)
        torch.manual_seed(cfg.seed)  # engines build the same initial weights from the same seed
        self.model = build_policy(cfg, *policy_shape(cfg)).to(self.device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.99))
        self.version = 0  # weight version of self.model; engines serve it after publication

    def train_step(self, groups: list[Group]) -> dict[str, float]:
        """One GRPO update on a batch of groups; bumps the version. The caller owns the group objects.

        The first minibatch's forward pass runs with the weights of `self.version`, before any optimizer step:
        its log-probs of the tokens sampled with that version are compared with the engines' recorded ones
        (`logprob_diff_mean`, `logprob_diff_max`; absent when none was sampled with it)."""
        t0 = time.monotonic()
        cfg = self.cfg
        batch = batch_from_groups(groups, self.device, self.model.tok.num_embeddings)
        B = batch.tokens.shape[0]
        stats: dict[str, float] = {}
        parity: dict[str, float] | None = None
        self.model.train()
        for _ in range(cfg.ppo_epochs):
            order = torch.arange(B)
            for idx in order.chunk(cfg.minibatches):
                sub = batch.select(idx)
                loss, stats, logp = ppo_loss(
                    self.model,
                    sub,
                    clip_eps=cfg.clip_eps,
                    entropy_coef=cfg.entropy_coef,
                    kl_coef=cfg.kl_coef,
                    temperature=cfg.temperature,
                )
                if parity is None:  # no optimizer step yet: these are the weights the fresh tokens came from
                    parity = logprob_parity(logp, sub, self.version)
                self.opt.zero_grad(set_to_none=True)
                torch.autograd.backward(loss)  # loss.backward(), which torch leaves unannotated
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                self.opt.step()
                stats["loss"] = loss.item()
                stats["grad_norm"] = float(grad_norm)
        self.version += 1
        stats.update(parity or {})
        stats.update(
            reward_mean=batch.rewards.mean().item(),
            exact_match=batch.exact.mean().item(),
            train_seconds=time.monotonic() - t0,
            version=self.version,
        )
        return stats

    @torch.no_grad()
    def logprobs(self, groups: list[Group]) -> list[list[list[float]]]:
        """The current policy's log-prob of every token of every row of `groups` given the tokens before it,
        laid out like `Group.logprobs`, each row its own length (the first position, which nothing predicts, is 0.0)."""
        batch = batch_from_groups(groups, self.device, self.model.tok.num_embeddings)
        logp, _ = sequence_logprobs(self.model, batch.tokens, self.cfg.temperature, batch.bias())
        rows = iter(logp.cpu().tolist())  # batch order: every group's rows in turn
        return [[[0.0] + next(rows)[: len(row.tokens) - 1] for row in g.rows] for g in groups]

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu").clone() for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.weights(),
            "optimizer": self.opt.state_dict(),
            "version": self.version,
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.version = state["version"]
        torch.set_rng_state(state["torch_rng"])

    def info(self) -> dict[str, Any]:
        return {
            "device": str(self.device),
            "version": self.version,
            "parameters": sum(p.numel() for p in self.model.parameters()),
        }
