"""The run's data path: rollout workers put finished groups into the channel, the learner takes token-weighted
batches out of it, and the scheduler's ledger (receipts) says which of the taken groups are trained.

- Key: the task's name (`channel_key`). A worker's filters decide first; only kept groups go in (a dropped one
  is counted by the scheduler from its receipt, and never shipped).
- Weight: `GroupTokens`, the channel's collector, gives each group its generated-token count, and counts the
  groups and tokens that came in per key; `Channel.metrics` returns those counts with the queue depths and the
  driver puts them in the rollout event (`channel`).
- Batch: the learner takes `batch_tokens(cfg)` tokens' worth (`Channel.get_batch`, FIFO). Groups of this
  project's in-process tasks all have the same generated length, so that is `prompts_per_step` groups; ragged
  groups (episodes over HTTP, trainer/trajectories.py) weigh what their rows generated, so longer or shorter ones
  make a batch of fewer or more. Groups the ledger drops from it (stale, orphan) are replaced by a
  top-up: `batch_tokens(cfg, n)` for the `n` missing (trainer/collect.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from rollout.channel import ChannelContext, Collector
from rollout.filters import MinValidAttemptsFilter, ZeroVarianceFilter
from trainer.config import TrainConfig
from trainer.problems import task_build


def channel_key(cfg: TrainConfig) -> str:
    """The channel key a run's groups go under: its task's name."""
    return cfg.task


def group_tokens(group: Any) -> int:
    """Generated tokens of a group (every row's positions with loss mask 1): its channel weight. A group an
    agent environment ran weighs its episodes' token budget instead (`meta["weight"]`: their lengths vary, and
    the learner's take must still be exactly `prompts_per_step` groups)."""
    weight = group.meta.get("weight")
    return int(weight) if weight else int(group.generated_tokens)


def response_len_max(cfg: TrainConfig) -> int:
    """Tokens one episode may generate: the task's turns x turn length, or the environment's budget."""
    if cfg.environment:
        from trainer.agent_episodes import build_environment, episode_budget

        return episode_budget(build_environment(cfg))
    task = task_build(cfg)
    return task.turns * task.turn_len()


def batch_tokens(cfg: TrainConfig, groups: int | None = None) -> float:
    """The learner's token budget per step: `prompts_per_step` groups (or `groups`, a top-up) of the task's
    generated length."""
    n = cfg.prompts_per_step if groups is None else groups
    return float(n * cfg.group_size * response_len_max(cfg))


def build_filters(cfg: TrainConfig) -> list[Any]:
    """The group filters the config asks for; the rollout workers apply them before anything is put."""
    filters: list[Any] = []
    if cfg.filter_zero_variance:
        filters.append(ZeroVarianceFilter())
    if cfg.min_valid_attempts >= 1:
        filters.append(MinValidAttemptsFilter(cfg.min_valid_attempts))
    return filters


class GroupTokens(Collector):
    """The run's channel collector: weight = generated tokens; per key, the groups and tokens that came in."""

    def setup(self, ctx: ChannelContext) -> None:
        super().setup(ctx)
        self.groups: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()

    def collect(self, item: Any, key: str) -> Iterable[tuple[Any, ...]]:
        tokens = group_tokens(item)
        self.groups[key] += 1
        self.tokens[key] += tokens
        yield key, item, float(tokens)

    def metrics(self) -> dict[str, float]:
        out = {f"{key}/groups_in": float(n) for key, n in self.groups.items()}
        out.update({f"{key}/tokens_in": float(n) for key, n in self.tokens.items()})
        return out
