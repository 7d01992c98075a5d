"""Which prompt each group gets: a deterministic per-epoch shuffle plus a persisted global group count.

Resume is exact because the state is just (group_count, epoch, position in epoch) and the permutation of an
epoch is a pure function of (seed, epoch). Group ids are the global group count at hand-out: unique, stable.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from typing import Any

from trainer.episodes import GroupTicket


class GroupSampler:
    def __init__(self, dataset_size: int, seed: int) -> None:
        if dataset_size < 1:
            raise ValueError("dataset_size: the task has no training prompts")
        self.dataset_size, self.seed = dataset_size, seed
        self.group_count = 0  # groups handed out since the start of the run, across resumes
        self.epoch = 0  # logical epoch: advances when a permutation is used up, never reset by resume
        self.position = 0  # groups handed out in this epoch
        self._perm = self._permutation(0)
        self.returned: deque[GroupTicket] = deque()  # handed back undelivered: handed out again, first
        self._lock = threading.Lock()  # the scheduler thread takes groups while the driver reads progress

    def _permutation(self, epoch: int) -> list[int]:
        perm = list(range(self.dataset_size))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(perm)
        return perm

    def next(self) -> GroupTicket:
        if self.position >= self.dataset_size:
            self.epoch += 1
            self.position = 0
            self._perm = self._permutation(self.epoch)
        ticket = GroupTicket(group_id=self.group_count, epoch=self.epoch, prompt_index=self._perm[self.position])
        self.group_count += 1
        self.position += 1
        return ticket

    def get_groups(self, n: int) -> list[GroupTicket]:
        """Up to n tickets (rollout.RolloutScheduler's data-source protocol); returned ones come first."""
        with self._lock:
            out = [self.returned.popleft() for _ in range(min(n, len(self.returned)))]
            while len(out) < n:
                out.append(self.next())
            return out

    def return_groups(self, groups: list[GroupTicket]) -> None:
        """Tickets that were not delivered (aborted, cancelled, stale): re-run with the same group id."""
        with self._lock:
            self.returned = deque(sorted([*self.returned, *groups], key=lambda t: t.group_id))

    def progress(self) -> dict[str, int]:
        """The `sampler` event's data."""
        return {
            "epoch": self.epoch,
            "group_count": self.group_count,
            "dataset_size": self.dataset_size,
            "consumed_in_epoch": self.position,
        }

    def state_dict(self, also_returned: list[GroupTicket] | None = None) -> dict[str, Any]:
        """`also_returned`: tickets to save as returned too (a checkpoint's groups waiting in the channel)."""
        with self._lock:
            returned = sorted([*self.returned, *(also_returned or [])], key=lambda t: t.group_id)
            return {
                "group_count": self.group_count,
                "epoch": self.epoch,
                "position": self.position,
                "dataset_size": self.dataset_size,
                "seed": self.seed,
                "returned": [(t.group_id, t.epoch, t.prompt_index) for t in returned],
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["dataset_size"] != self.dataset_size or state["seed"] != self.seed:
            raise ValueError("sampler state belongs to a different dataset or seed")
        self.group_count, self.epoch, self.position = state["group_count"], state["epoch"], state["position"]
        self._perm = self._permutation(self.epoch)
        self.returned = deque(GroupTicket(*t) for t in state.get("returned", []))
