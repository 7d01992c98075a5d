"""Victim selection for preemption (issue 26 item 1): given the grant's snapshot, which held runs to checkpoint and
stop so that waiting runs of preempting classes can be granted. Pure: no Django; the caller applies the result
under the grant lock (runs/execution/preempt.py). Off unless some class `preempts` and some is `preemptible`
(runs/slots/preempt_policy.py): then nothing is ever chosen and the grant decides exactly as before.

Rules, in the grant's queue order (`runs.slots.order.queue_order`), on a copy of the snapshot that plays the pass
forward:
- a waiting run that can be granted as things stand takes its place (it needs no victim; later runs see it held);
- a waiting run of a class that `preempts`, that the class rules or the free resources keep waiting, gets victims
  among the held, stoppable (running) runs of `preemptible` classes of strictly lower class priority that are not
  already being preempted and were preempted fewer than `max_preemptions_per_run_per_day` times in 24 hours;
- candidates are taken lowest class priority first, then the most recent checkpoint (least work lost; never
  checkpointed last), then the latest grant, then the highest id; taken one by one until the waiting run fits
  (class limits, total, reserve, GPU limit, its owner's per-user limit, its team's quota and borrowing limit (a
  victim is of another class, so it never frees a team's quota: a run its team holds back gets no victim), and
  `pack` of its bundles onto the nodes
  with the victims' bundles freed); then every victim the others make unnecessary is dropped again (the least
  preferred first), so no victim can be spared: never more than needed. No set fits: no victim at all;
- a victim already being preempted for a waiting run counts as gone, and that waiting run as granted, so a next
  pass neither chooses again for it nor takes its place for another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from runs.slots.grant import HeldSlot, Snapshot, WaitingSlot, blocking_reason, gpu_blocked, user_blocked
from runs.slots.order import queue_order
from runs.slots.policy import CLASSES, Policy
from runs.slots.quota import BLOCKED, TeamLedger
from runs.slots.resources import Res, pack, total


@dataclass(frozen=True)
class HeldState:
    """What preemption knows of a held run beyond its slot (loaded by the caller)."""

    checkpoint_at: datetime | None = None  # its latest checkpoint (None: none yet)
    preemptions_today: int = 0  # preemptions requested in the last 24 hours
    preempting_for: int | None = None  # an open preemption: the waiting run it makes room for
    stoppable: bool = True  # it can be stopped for another now (the caller: only `running` runs)


@dataclass(frozen=True)
class Victim:
    run_id: int
    run_class: str
    for_run: int  # the waiting run it makes room for
    for_class: str
    reason: str


@dataclass
class _Pass:
    """The pass played forward: held counts, GPUs, owners' held runs, free resources, the runs still held."""

    policy: Policy
    held: dict[str, int]
    gpus: dict[str, int]
    by_owner: dict[tuple[str, int], int]
    free: dict[str, Res]
    running: dict[int, HeldSlot] = field(default_factory=dict)
    teams: TeamLedger | None = None  # held runs per team, in classes with team quotas

    def release(self, h: HeldSlot) -> None:
        self.running.pop(h.run_id, None)
        self.held[h.run_class] -= 1
        self.gpus[h.run_class] -= total(h.demand).gpu
        self.by_owner[(h.run_class, h.owner)] -= 1
        if self.teams is not None:
            self.teams.release(h.run_class, h.owner)
        for bundle, node in zip(h.demand, h.placement):
            if node in self.free:
                self.free[node] = self.free[node] + bundle

    def place(self, run_class: str, w: WaitingSlot) -> tuple[str, ...] | None:
        """Where the run would go now under the class rules and resources (None: it cannot be granted now)."""
        if blocking_reason(self.policy, self.held, run_class) is not None:
            return None
        if gpu_blocked(self.policy, self.gpus, run_class, w.demand):
            return None
        if user_blocked(self.policy.fairness.of(run_class), self.by_owner, run_class, w.owner):
            return None
        if self.teams is not None and self.teams.standing(run_class, w.owner) == BLOCKED:
            return None
        placement = pack(w.demand, self.free, w.strategy)
        return tuple(placement) if placement is not None else None

    def take(self, run_class: str, w: WaitingSlot, placement: Sequence[str]) -> None:
        self.held[run_class] += 1
        self.gpus[run_class] += total(w.demand).gpu
        self.by_owner[(run_class, w.owner)] = self.by_owner.get((run_class, w.owner), 0) + 1
        if self.teams is not None:
            self.teams.take(run_class, w.owner)
        for bundle, node in zip(w.demand, placement):
            self.free[node] = self.free[node] - bundle

    def fits_without(self, run_class: str, w: WaitingSlot, victims: Sequence[HeldSlot]) -> bool:
        teams = self.teams.copy() if self.teams is not None else None
        trial = _Pass(self.policy, dict(self.held), dict(self.gpus), dict(self.by_owner), dict(self.free), teams=teams)
        for h in victims:
            trial.release(h)
        return trial.place(run_class, w) is not None


def candidate_key(h: HeldSlot, state: HeldState, priority: int) -> tuple:
    """Lowest class priority first, then the most recent checkpoint (none: last), then the latest grant, id."""
    checkpoint = state.checkpoint_at.timestamp() if state.checkpoint_at else float("-inf")
    granted = h.granted_at.timestamp() if h.granted_at else float("-inf")
    return (priority, -checkpoint, -granted, -h.run_id)


def choose(
    snapshot: Snapshot, now: datetime, states: Mapping[int, HeldState], *, every_head: bool = True
) -> list[Victim]:
    """The victims to preempt now, in the order chosen (see the module docstring). `states`: per held run id
    (a run without an entry: never checkpointed, never preempted). `every_head=False`: stop after the first
    waiting run that gets victims (the dry-run's question)."""
    policy = snapshot.policy
    rules = policy.preemption
    if not rules.on or not snapshot.capacity:
        return []
    play = _Pass(
        policy,
        {k: snapshot.held.get(k, 0) for k in CLASSES},
        snapshot.held_gpus(),
        snapshot.held_by_owner(),
        snapshot.free,
        {h.run_id: h for h in snapshot.running},
        TeamLedger(policy.quotas, policy.limits, snapshot.running, snapshot.groups),
    )
    served: set[int] = set()
    for h in snapshot.running:  # preemptions under way: their victims are gone, their waiting runs served
        waiting_for = states.get(h.run_id, HeldState()).preempting_for
        if waiting_for is not None:
            play.release(h)
            served.add(waiting_for)
    victims: list[Victim] = []
    for run_class, w in queue_order(policy, snapshot.waiting, snapshot.usage, now):
        if w.run_id in served and (placement := play.place(run_class, w)) is not None:
            play.take(run_class, w, placement)
            continue
        if w.run_id in served:
            continue  # its victims are still stopping; it waits for them, never for more
        placement = play.place(run_class, w)
        if placement is not None:
            play.take(run_class, w, placement)  # grantable as it is: it needs nobody's place
            continue
        if not rules.of(run_class).preempts:
            continue
        chosen = _victims_for(play, run_class, w, states)
        if not chosen:
            continue
        for h in chosen:
            play.release(h)
            reason = (
                f"preempted for run {w.run_id} ({run_class}, priority {policy.classes[run_class].priority}) "
                f"over this {h.run_class} run (priority {policy.classes[h.run_class].priority})"
            )
            victims.append(Victim(h.run_id, h.run_class, w.run_id, run_class, reason))
        placement = play.place(run_class, w)
        assert placement is not None  # _victims_for checked it
        play.take(run_class, w, placement)
        if not every_head:
            break
    return victims


def _victims_for(play: _Pass, run_class: str, w: WaitingSlot, states: Mapping[int, HeldState]) -> list[HeldSlot]:
    """The fewest preferred victims that let `w` be granted (see the module docstring); [] when none do."""
    policy, rules = play.policy, play.policy.preemption
    mine = policy.classes[run_class].priority
    cap = rules.max_per_run_per_day

    def eligible(h: HeldSlot) -> bool:
        state = states.get(h.run_id, HeldState())
        lower = policy.classes[h.run_class].priority < mine
        return rules.of(h.run_class).preemptible and lower and state.preemptions_today < cap and state.stoppable

    candidates = [h for h in play.running.values() if eligible(h)]
    candidates.sort(
        key=lambda h: candidate_key(h, states.get(h.run_id, HeldState()), policy.classes[h.run_class].priority)
    )
    chosen: list[HeldSlot] = []
    for h in candidates:
        chosen.append(h)
        if play.fits_without(run_class, w, chosen):
            break
    else:
        return []
    for h in reversed(list(chosen)):  # spare every victim the others make unnecessary, least preferred first
        rest = [c for c in chosen if c is not h]
        if rest and play.fits_without(run_class, w, rest):
            chosen = rest
    return chosen
