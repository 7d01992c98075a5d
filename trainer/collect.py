"""Collecting one step's batch: generate, take from the channel, claim, and top up what the ledger dropped.

The scheduler collects `prompts_per_step` kept groups (the workers put them into the channel); the learner
takes that many groups' tokens from the channel; the scheduler's ledger claims what it took: `train`, `stale`
(a token older than version - max_staleness: its ticket goes back to the sampler and is generated again) or
`orphan` (a copy no receipt stands for: dropped). Every dropped group is replaced: the scheduler collects as
many more, the learner adds them to the batch it holds, the ledger claims them, and so on until exactly
`prompts_per_step` groups are claimed for training. Only a stop ends a batch short: the groups claimed so far
are then trained (the ledger consumed them, so training them is what keeps them from being lost to a resume).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from rollout.scheduler_core import rollout_batch
from rollout.types import GroupResult, RolloutBatch
from trainer.config import TrainConfig
from trainer.episodes import Group
from trainer.runtime import Runtime


@dataclass
class Collected:
    """One step's batch: the groups to train (sorted by group id) and what it took to get them."""

    groups: list[Group]
    batch: RolloutBatch  # every round's receipts, filter drops and aborts together
    taken: int  # groups the learner took from the channel
    stale: int  # of them: too old, their tickets back to the sampler
    orphans: int  # of them: copies no receipt stood for, dropped
    refilled: int  # groups collected to replace the stale and orphan ones
    seconds: float
    started_at: float  # wall clock

    def channel_counts(self) -> dict[str, int]:
        """The rollout event's `channel` counts of this batch (besides the channel's own metrics)."""
        return {"taken": self.taken, "orphans": self.orphans, "refilled": self.refilled}


def collect(rt: Runtime, cfg: TrainConfig, version: int, stopping: Callable[[], bool]) -> Collected:
    """Generate at `version` until `prompts_per_step` groups are claimed for training (fewer only when
    `stopping()` turns true during a top-up)."""
    t0, started_at = time.monotonic(), time.time()
    prefetch = cfg.max_staleness * cfg.prompts_per_step
    floor = version - cfg.max_staleness  # staleness guard: older groups are generated again
    groups: list[Group] = []
    receipts: list[GroupResult] = []
    dropped: Counter[str] = Counter()
    aborted = taken_n = stale = orphans = refilled = rounds = 0
    need = cfg.prompts_per_step
    while need > 0:
        top_up, rounds = rounds > 0, rounds + 1
        if top_up and stopping():
            break
        try:
            batch = rt.scheduler.generate(version, prefetch=prefetch, size=need if top_up else None)
        except Exception:
            if top_up and stopping():
                break  # the stop closed the scheduler: what was claimed is trained, the rest went back
            raise
        receipts += batch.groups
        dropped.update(batch.dropped)
        aborted += batch.aborted
        refilled += need if top_up else 0
        taken = rt.take_batch(need, more=top_up)
        verdicts = rt.scheduler.claim([(g.group_id, g.meta.get("attempt"), g.min_version < floor) for g in taken])
        groups += [g for g, v in zip(taken, verdicts) if v == "train"]
        taken_n += len(taken)
        stale += verdicts.count("stale")
        orphans += verdicts.count("orphan")
        need = cfg.prompts_per_step - len(groups)
    return Collected(
        groups=sorted(groups, key=lambda g: g.group_id),
        batch=rollout_batch(version, receipts, dict(dropped), aborted),
        taken=taken_n,
        stale=stale,
        orphans=orphans,
        refilled=refilled,
        seconds=time.monotonic() - t0,
        started_at=started_at,
    )
