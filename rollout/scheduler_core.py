"""The rollout scheduler's bookkeeping as a pure state machine: capacities, prefetch bound, dispatch ledger.

No threads, no Ray: RolloutScheduler drives it, and property tests drive it with random event sequences.
Every dispatched group is in exactly one place: pending (at a worker), ready, collecting (this batch),
delivered, dropped by a filter, or handed back to the source (`take_returns`). With `claims` (the results are
receipts for groups a worker put into a channel), a delivered result stays `handed` until the channel's consumer
claims the item it took (`claim`): then it is consumed, or stale (its group goes back to the source).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable
from typing import Any

from rollout.errors import NoWorkerLeftError, SchedulerStateError
from rollout.filters import FilterVerdict
from rollout.types import GroupResult, RolloutBatch


class SchedulerCore:
    def __init__(self, capacities: list[int], batch_size: int, *, claims: bool = False) -> None:
        if not capacities or any(c < 0 for c in capacities) or sum(capacities) == 0:
            raise ValueError(f"capacities must be non-negative with a positive total, got {capacities}")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.capacities = list(capacities)
        self.batch_size = batch_size
        self.in_flight = [0] * len(capacities)
        self.pending: dict[Hashable, tuple[int, int, Any]] = {}  # token -> (worker, seq, group)
        self.ready: deque[tuple[int, GroupResult, Any]] = deque()  # (seq, result, group)
        self.collecting: list[tuple[int, GroupResult, Any]] = []
        self.returns: list[Any] = []  # groups to hand back to the source
        self.claims = claims
        self.handed: list[tuple[int, GroupResult, Any]] = []  # claims: delivered, its channel item not claimed
        self.demand = 0
        self.prefetch = 0
        self.paused = True
        self.seq = 0
        self.dropped: Counter[str] = Counter()  # since the last finished batch
        self.aborted = 0  # since the last finished batch
        self.totals: Counter[str] = Counter()  # lifetime: dispatched, delivered, dropped, returned, recovered

    @property
    def capacity(self) -> int:
        return sum(self.capacities)

    # --- dispatch -----------------------------------------------------------------------------------------
    def budget(self) -> int:
        """How many more groups may be dispatched now without breaking pending + ready <= demand + prefetch."""
        if self.paused:
            return 0
        free = sum(c - f for c, f in zip(self.capacities, self.in_flight) if c > f)
        bound = self.demand + self.prefetch - len(self.pending) - len(self.ready)
        return max(0, min(free, bound))

    def dispatch_slots(self) -> list[int]:
        """Worker indexes for the next dispatches, most free capacity first (ties: lowest index)."""
        slots: list[int] = []
        free = [c - f for c, f in zip(self.capacities, self.in_flight)]
        for _ in range(self.budget()):
            worker = max(range(len(free)), key=lambda i: (free[i], -i))
            if free[worker] <= 0:
                break
            free[worker] -= 1
            slots.append(worker)
        return slots

    def register(self, token: Hashable, worker: int, group: Any) -> int:
        if self.capacities[worker] <= self.in_flight[worker]:
            raise SchedulerStateError(f"worker {worker} has no free capacity")
        self.seq += 1
        self.pending[token] = (worker, self.seq, group)
        self.in_flight[worker] += 1
        self.totals["dispatched"] += 1
        return self.seq

    # --- outcomes -----------------------------------------------------------------------------------------
    def complete(self, token: Hashable, result: GroupResult, verdict: FilterVerdict) -> None:
        """A worker call returned a result (possibly aborted, possibly filtered out)."""
        worker, seq, group = self._pop(token)
        if result.aborted:
            self.returns.append(group)
            self.aborted += 1
            self.totals["returned"] += 1
        elif not verdict.keep:
            self.dropped[verdict.reason or "filter"] += 1
            self.totals["dropped"] += 1
        else:
            self.ready.append((seq, result, group))

    def fail(self, token: Hashable) -> Any:
        """The call failed without a result: its group goes back to the source."""
        _, _, group = self._pop(token)
        self.returns.append(group)
        self.totals["returned"] += 1
        return group

    def retire(self, worker: int) -> list[Hashable]:
        """Capacity to 0; returns the worker's unfinished tokens for the caller to recover or fail."""
        self.capacities[worker] = 0
        self.prefetch = min(self.prefetch, self.capacity)
        tokens = [t for t, (w, _, _) in self.pending.items() if w == worker]
        if not self.capacity:
            # Nothing can make progress: hand everything still pending back before raising.
            for token in list(self.pending):
                self.fail(token)
            raise NoWorkerLeftError("every rollout worker has been retired")
        return tokens

    def return_undelivered(self) -> None:
        """Closing: every result not delivered (or handed and not claimed) goes back to the source."""
        self.returns += [entry[2] for entry in [*self.handed, *self.ready]]
        self.handed.clear()
        self.ready.clear()

    def take_returns(self) -> list[Any]:
        returns, self.returns = self.returns, []
        return returns

    def _pop(self, token: Hashable) -> tuple[int, int, Any]:
        worker, seq, group = self.pending.pop(token)
        self.in_flight[worker] -= 1
        return worker, seq, group

    # --- batches ------------------------------------------------------------------------------------------
    def start_batch(self, prefetch: int, size: int | None = None) -> None:
        """Collect `size` kept groups (default `batch_size`: a smaller one tops up a batch whose consumer
        dropped some of what it took)."""
        if self.demand or self.collecting:
            raise SchedulerStateError("a batch is already being collected")
        if prefetch < 0:
            raise ValueError("prefetch must be >= 0")
        if size is not None and size < 1:
            raise ValueError("size must be >= 1")
        self.demand = self.batch_size if size is None else size
        self.prefetch = min(prefetch, self.capacity)
        self.paused = False

    def collect(self) -> bool:
        """Move ready results into the batch; True when the batch is complete."""
        while self.demand and self.ready:
            self.collecting.append(self.ready.popleft())
            self.demand -= 1
        return self.demand == 0

    def finish_batch(self) -> tuple[list[GroupResult], dict[str, int], int]:
        entries, self.collecting = self.collecting, []
        if self.claims:
            self.handed.extend(entries)
        groups = [entry[1] for entry in entries]
        dropped, aborted = dict(self.dropped), self.aborted
        self.dropped.clear()
        self.aborted = 0
        self.totals["delivered"] += len(groups)
        return groups, dropped, aborted

    def abandon_batch(self) -> None:
        """An error stopped collection: collected results go back to the front of ready (nothing is lost)."""
        for entry in reversed(self.collecting):
            self.ready.appendleft(entry)
        self.collecting = []
        self.demand = 0

    # --- claims (results that are receipts for channel items) --------------------------------------------
    def claim(self, items: list[tuple[Any, Any, bool]]) -> list[str]:
        """The channel's consumer took these items, each (group_id, attempt, stale). Verdicts: `train` (a
        handed or ready result stands for it: consumed now), `stale` (too old to train: its group goes back to
        the source) or `orphan` (no result stands for it: a copy from an abandoned attempt, to be dropped).
        Claiming a ready result rather than a handed one moves the oldest handed result back to ready (it stays
        in the channel, undelivered), so pending + ready still bounds what the channel holds."""
        if not self.claims:
            raise SchedulerStateError("claim() needs a scheduler whose results are receipts (claims=True)")
        verdicts: list[str] = []
        for group_id, attempt, stale in items:
            entry = self._unclaimed(group_id, attempt)
            if entry is None:
                self.totals["orphans"] += 1
                verdicts.append("orphan")
            elif stale:
                self.returns.append(entry[2])
                self.totals["stale"] += 1
                verdicts.append("stale")
            else:
                self.totals["claimed"] += 1
                verdicts.append("train")
        return verdicts

    def pending_group(self, group_ids: set[Any]) -> bool:
        """Is a group with one of these ids still at a worker (its receipt not in yet)? A group is named by its
        `group_id` attribute, or is its own id (a plain ticket)."""
        return any(getattr(group, "group_id", group) in group_ids for _, _, group in self.pending.values())

    def _unclaimed(self, group_id: Any, attempt: Any) -> tuple[int, GroupResult, Any] | None:
        for i, entry in enumerate(self.handed):
            if (entry[1].group_id, entry[1].attempt) == (group_id, attempt):
                return self.handed.pop(i)
        for i, entry in enumerate(self.ready):
            if (entry[1].group_id, entry[1].attempt) == (group_id, attempt):
                del self.ready[i]
                if self.handed:
                    self.ready.appendleft(self.handed.pop(0))
                return entry
        return None

    def stats(self) -> dict[str, Any]:
        return {
            "pending": len(self.pending),
            "ready": len(self.ready),
            "handed": len(self.handed),
            "demand": self.demand,
            "prefetch": self.prefetch,
            "capacity": self.capacity,
            "capacities": list(self.capacities),
            "in_flight": list(self.in_flight),
            "paused": self.paused,
            "workers_alive": sum(1 for c in self.capacities if c),
            **dict(self.totals),
        }

    # --- persistence --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """`ready` holds every undelivered result, unclaimed handed ones first (their items are in the channel)."""
        return {
            "ready": [*self.handed, *self.ready],
            "seq": self.seq,
            "totals": dict(self.totals),
            "dropped": dict(self.dropped),
            "aborted": self.aborted,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ready = deque((int(seq), result, group) for seq, result, group in state["ready"])
        self.seq = int(state["seq"])
        self.totals = Counter(state.get("totals", {}))
        self.dropped = Counter(state.get("dropped", {}))
        self.aborted = int(state.get("aborted", 0))


def rollout_batch(batch_id: Any, groups: list[GroupResult], dropped: dict[str, int], aborted: int) -> RolloutBatch:
    """A finished batch with its drop accounting and metrics."""
    n_dropped = sum(dropped.values())
    ratio = n_dropped / (len(groups) + n_dropped)
    metrics = {f"rollout/drop_{reason}": float(n) for reason, n in dropped.items()}
    metrics.update(
        {
            "rollout/dropped_groups": float(n_dropped),
            "rollout/dropped_ratio": ratio,
            "rollout/aborted_groups": float(aborted),
        }
    )
    return RolloutBatch(batch_id, groups, dropped, ratio, aborted, metrics)
