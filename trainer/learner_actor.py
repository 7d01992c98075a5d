"""The learner actor: a Learner that takes token-weighted batches from the Channel (trainer/data_path.py) and
evaluates its own policy.

Deployed as a Ray actor in the learner's bundle (with its GPUs, if the config asks for any) or used in-process
in local mode; the driver (`trainer.runtime.Runtime`) calls it the same way in both.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from rollout.channel import Channel
from trainer.config import TrainConfig
from trainer.data_path import channel_key
from trainer.episodes import Group
from trainer.evaluate import OneTurnRequest, eval_prompts, evaluate, greedy_replies
from trainer.learner import Learner
from trainer.problems import task_build


class InjectedFailure(RuntimeError):
    """A training step failed on purpose (tests of failure cleanup)."""


class LearnerActor(Learner):
    def __init__(self, cfg: TrainConfig, channel_name: str, *, threads: int = 1, gpus: float = 0.0) -> None:
        torch.set_num_threads(threads)  # the whole CPUs of its bundle, at least one
        super().__init__(cfg, gpus=gpus)
        self.task = task_build(cfg)
        self.channel_name = channel_name
        self._channel: Channel | None = None
        self.key = channel_key(cfg)
        self._taken: dict[tuple[int, Any], Group] = {}  # the last batch taken, until it is trained
        self._fail_next = 0
        self._step_delay_s = 0.0

    @property
    def channel(self) -> Channel:
        if self._channel is None:
            self._channel = Channel.connect(self.channel_name)
        return self._channel

    def take_batch(self, target_tokens: float, timeout_s: float = 60.0, more: bool = False) -> list[Group]:
        """Take a token-weighted batch from the channel (FIFO: the first group always, then more while their
        generated tokens fit `target_tokens`) and hold it for `train_taken`; with `more`, add them to the batch
        already held (a top-up for groups the ledger dropped). Returns the groups taken now: the driver asks
        the scheduler's ledger which of them to train, and reports on them."""
        groups: list[Group] = self.channel.get_batch(target_weight=target_tokens, key=self.key, timeout=timeout_s)
        if not more:
            self._taken = {}
        self._taken.update({(g.group_id, g.meta.get("attempt")): g for g in groups})
        return groups

    def train_taken(self, keys: list[tuple[int, Any]]) -> dict[str, float]:
        """One step on these of the taken groups ((group_id, attempt), in this order); the rest are dropped.
        The taken batch is let go whether the step succeeds or fails."""
        taken, self._taken = self._taken, {}
        groups = [taken[(group_id, attempt)] for group_id, attempt in keys]
        del taken
        if self._fail_next:
            self._fail_next -= 1
            raise InjectedFailure("injected training failure")
        if self._step_delay_s:
            time.sleep(self._step_delay_s)  # throttle(): a slow learner, on purpose
        return self.train_step(groups)

    def inject_failures(self, n: int) -> None:
        self._fail_next = n

    def throttle(self, step_delay_s: float) -> None:
        """Fault injection for tests and drills: every training step takes `step_delay_s` longer (0: off)."""
        if not 0 <= step_delay_s <= 60:
            raise ValueError("step_delay_s must be within [0, 60]")
        self._step_delay_s = step_delay_s

    def greedy_replies(self, requests: list[OneTurnRequest], stop: int) -> list[list[int]]:
        """Greedy replies of this learner's weights to one-turn requests (an agent environment's evaluation:
        trainer/agent_episodes.py `evaluate_one_turn`)."""
        return greedy_replies(self.model, requests, stop, self.cfg.temperature)

    def evaluate(self, n_prompts: int) -> dict[str, float]:
        """Greedy exact-match and reward on (a fixed subset of) training and held-out prompts."""
        train = evaluate(self.model, self.task, eval_prompts(self.task.train_prompts, n_prompts))
        held = evaluate(self.model, self.task, eval_prompts(self.task.held_out_prompts, n_prompts))
        return {
            "train_exact_match": train["exact_match"],
            "train_reward": train["reward"],
            "held_out_exact_match": held["exact_match"],
            "held_out_reward": held["reward"],
        }
