"""The learner actor: a Learner that takes its batches from the Channel and evaluates its own policy.

Deployed as a Ray actor in the learner's bundle (with its GPUs, if the config asks for any) or used in-process
in local mode; the driver (`trainer.topology.Runtime`) calls it the same way in both.
"""

from __future__ import annotations

from typing import Any

import torch

from rollout.channel import Channel
from trainer.config import TrainConfig
from trainer.evaluate import eval_prompts, evaluate
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
        self._fail_next = 0

    @property
    def channel(self) -> Channel:
        if self._channel is None:
            self._channel = Channel.connect(self.channel_name)
        return self._channel

    def train_from_channel(self, n_groups: int, timeout_s: float = 60.0) -> dict[str, float]:
        """Take one batch (weighted by its group count) from the channel and train on it."""
        items = self.channel.get_batch(target_weight=max(1, n_groups), timeout=timeout_s)
        groups: list[Any] = []
        for item in items:
            groups.extend(_materialize(item))
        del items
        if self._fail_next:
            self._fail_next -= 1
            raise InjectedFailure("injected training failure")
        return self.train_step(groups)

    def inject_failures(self, n: int) -> None:
        self._fail_next = n

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


def _materialize(item: Any) -> list[Any]:
    try:
        import ray

        if isinstance(item, ray.ObjectRef):
            return list(ray.get(item))
    except ImportError:  # pragma: no cover
        pass
    return list(item)
