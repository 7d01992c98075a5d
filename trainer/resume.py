"""Checkpoint and restore of a training run: what a checkpoint holds, when it is consistent, how a run resumes.

A checkpoint holds the trainer (policy, optimizer, version), the sampler, the scheduler's counters, the Python
and torch RNG states and the consumed (group_id, epoch) list. Groups waiting in the channel are not saved: the
checkpoint lists their tickets as returned to the sampler, and a resumed run generates them again. It is taken
at a step boundary with generation quiesced (scheduler paused, in-flight groups finished or aborted and returned
to the sampler by a deadline, every engine sealed and drained; a quiesce that cannot finish fails the checkpoint,
not the run), or after a stop with the scheduler closed (every untrained group is then back in the sampler). A
resumed run starts its engines closed, loads the trainer and scheduler, and publishes the restored weights
before anything is generated. The directory layout and atomic save/load are `trainer.checkpoint`.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rollout.errors import QuiesceTimeoutError
from trainer.checkpoint import checkpoint_latest, checkpoint_load, checkpoint_save
from trainer.plain import scheduler_state_from_plain, scheduler_state_to_plain

if TYPE_CHECKING:
    from trainer.loop import TrainingRun


@dataclass(frozen=True)
class Restored:
    """A checkpoint read for resuming: its meta.json and its state.pt."""

    meta: dict[str, Any]
    state: dict[str, Any]


def take_checkpoint(run: TrainingRun, reason: str, *, quiesce: bool = True) -> None:
    """Save the run's state under its checkpoint directory (nothing without one) and report it."""
    if not run.checkpoint_dir:
        return
    rt, t0, started_at = run.rt, time.monotonic(), time.time()
    scheduler_state = None
    in_channel: list[Any] = []  # tickets of the groups waiting in the channel
    quiesced: dict[str, int] = {}
    if quiesce:
        try:
            quiesced = quiesce_rollouts(run)
        except QuiesceTimeoutError as exc:
            rt.scheduler.resume()  # the run goes on; the late groups settle (aborted, re-run) without a checkpoint
            run.emit(
                "checkpoint",
                {
                    "step": run.version,
                    "version": run.version,
                    "reason": reason,
                    "state": "failed",
                    "error": str(exc),
                    "seconds": time.monotonic() - t0,
                },
            )
            return
        run.seal_engines()  # seal + drain every engine: nothing is generating while we save
        ledger = rt.scheduler.state_dict()
        # The channel is not saved: its groups' tickets are saved as returned, so a resumed run generates
        # them again (the live run still trains them: it keeps its channel).
        in_channel = [ticket for _, _, ticket in ledger["ready"]]
        scheduler_state = scheduler_state_to_plain({**ledger, "ready": []})
    state = {
        "trainer": rt.trainer_call("state_dict"),
        "sampler": run.sampler.state_dict(also_returned=in_channel),
        "scheduler": scheduler_state,
        "python_rng": random.getstate(),
        "torch_rng": torch.get_rng_state(),
        "consumed": list(run.consumed),
    }
    meta = {"version": run.version, "config": run.cfg.to_dict(), "sampler": run.sampler.progress(), "reason": reason}
    path = checkpoint_save(run.checkpoint_dir, step=run.version, meta=meta, state=state)
    if quiesce:
        rt.loop.run(rt.publication.resume())
        rt.scheduler.resume()
    run.last_checkpoint = str(path)
    run.checkpointed_version = run.version
    run.emit(
        "checkpoint",
        {
            "step": run.version,
            "version": run.version,
            "path": str(path),
            "reason": reason,
            "state": "saved",
            "seconds": time.monotonic() - t0,
            "span": {"start": started_at, "end": time.time()},
            **quiesced,
        },
    )


def quiesce_rollouts(run: TrainingRun) -> dict[str, int]:
    """Pause the scheduler; in-flight groups get `quiesce_timeout_s` to finish into `ready` (gates are still
    open), then the workers abort the rest between turns (their groups go back to the sampler) and they get
    `publish_deadline_s` more: one turn to end. QuiesceTimeoutError when some are still running after that."""
    rt, cfg = run.rt, run.cfg
    return rt.scheduler.quiesce(
        cfg.quiesce_timeout_s, abort=lambda: rt.workers_call("abort_episodes"), grace_s=cfg.publish_deadline_s
    )


def load_for_resume(run: TrainingRun) -> Restored | None:
    """Before the runtime starts: read the latest checkpoint (when resuming) into the sampler, version,
    consumed list and Python RNG. None when there is nothing to resume from."""
    if not (run.resume and run.checkpoint_dir and checkpoint_latest(run.checkpoint_dir)):
        return None
    meta, state = checkpoint_load(run.checkpoint_dir)
    run.sampler.load_state_dict(state["sampler"])
    run.version = meta["version"]
    run.consumed = [(int(group_id), int(epoch)) for group_id, epoch in state.get("consumed", [])]
    random.setstate(state["python_rng"])
    return Restored(meta, state)


def apply_restore(run: TrainingRun, restored: Restored) -> None:
    """Engines were started closed: load the trainer, then install the restored weights, then reopen."""
    rt, state = run.rt, restored.state
    run.emit_gate()  # sealed at version 0: nothing is generated before the restored weights are in
    rt.trainer_call("load_state_dict", state["trainer"])
    if state.get("scheduler"):
        ledger = scheduler_state_from_plain(state["scheduler"])
        # Ready results of a checkpoint from before the channel data path carried their groups inline; this
        # run's channel does not have them: their tickets go back to the sampler (generated again).
        run.sampler.return_groups([ticket for _, _, ticket in ledger["ready"]])
        rt.scheduler.load_state_dict({**ledger, "ready": []})
    run.gate_closed_at = time.monotonic()
    run.seal_engines()
    run.publish()
    latest = checkpoint_latest(run.checkpoint_dir) if run.checkpoint_dir else None
    run.emit("checkpoint", {"step": run.version, "version": run.version, "reason": "restored", "path": str(latest)})
    run.emit("sampler", run.sampler.progress())
