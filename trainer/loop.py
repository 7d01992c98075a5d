"""The driver loop of a training run: collect a batch -> train -> publish v+1 -> report -> checkpoint.

Reads top to bottom like the algorithm; everything about where things run is in `trainer.topology`, and
everything it reports goes through the injected `EventEmitter`.
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rollout.errors import PublicationError
from trainer.checkpoint import checkpoint_latest, checkpoint_load, checkpoint_save
from trainer.config import TrainConfig
from trainer.episodes import Group, GroupTicket
from trainer.sampler import GroupSampler
from trainer.sinks import EventEmitter
from trainer.tasks import task_build
from trainer.phases import run_debug_phase
from trainer.plain import scheduler_state_from_plain, scheduler_state_to_plain
from trainer.topology import Runtime, build_runtime


class StopRequested(Exception):
    """The job was asked to stop (SIGTERM from `ray job stop`, or the platform answered 409)."""


@dataclass
class RunResult:
    status: str  # succeeded | cancelled | failed
    version: int
    metrics: dict[str, Any] = field(default_factory=dict)
    consumed: list[tuple[int, int]] = field(default_factory=list)  # (group_id, epoch) in training order
    checkpoint: str | None = None


class TrainingRun:
    def __init__(self, cfg: TrainConfig, *, emitter: EventEmitter | None = None, checkpoint_dir: str | None = None,
                 resume: bool = False, on_step: Callable[["TrainingRun", list[Group]], None] | None = None) -> None:
        self.cfg = cfg
        self.emitter = emitter or EventEmitter([])
        self.checkpoint_dir = checkpoint_dir
        self.resume = resume
        self.on_step = on_step
        self.task = task_build(cfg)
        self.sampler = GroupSampler(len(self.task.train_prompts), cfg.seed)
        self.version = 0
        self.consumed: list[tuple[int, int]] = []
        self.metrics: dict[str, Any] = {}
        self.stop_event = threading.Event()
        self.gate_closed_s = 0.0
        self.samples = 0
        self.last_checkpoint: str | None = None
        self.rt: Runtime | None = None
        self._stopper: threading.Thread | None = None
        self._checkpointed_version = -1
        self._t0 = time.monotonic()

    # --- the algorithm ------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        cfg = self.cfg
        restored = self._restore_state()
        self.rt = rt = build_runtime(cfg, self.sampler, engines_open=restored is None)
        heartbeat = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
        try:
            self._emit("status", {"status": "running", "version": self.version})
            if restored is not None:
                self._apply_restore(restored)
            self._emit("worker", {"event": "started", "engines": sorted(rt.engines), "workers": len(rt.workers),
                                  "mode": cfg.mode, **rt.trainer_resources})
            self._emit_gate()
            heartbeat.start()
            if cfg.phase != "full":
                return run_debug_phase(self)
            self._t0 = time.monotonic()
            while self.version < cfg.steps:
                self._check_stop()
                groups = self._collect_batch()                # rollout: G samples per prompt, filtered
                self._seal_if_colocated()                     # colocated: generation pauses while training
                stats = self._train(groups)                   # GRPO step -> version + 1
                self._publish()                               # seal -> drain -> install v+1 -> reopen
                self._report(groups, stats)
                if self.on_step is not None:
                    self.on_step(self, groups)
                if cfg.checkpoint_every and self.version % cfg.checkpoint_every == 0:
                    self._checkpoint("periodic")
                if self._target_reached():
                    break
            if self.checkpoint_dir and self._checkpointed_version != self.version:
                self._checkpoint("final")
            self._emit("status", {"status": "succeeded", "version": self.version, "metrics": self.metrics})
            return self._result("succeeded")
        except Exception:
            # Closing the scheduler to stop may surface as any error of the step in progress.
            if not self.stop_event.is_set():
                self._emit_gate_quietly()  # e.g. a poisoned gate: the dashboard shows why the run failed
                raise
            return self._stop()
        finally:
            self.stop_event.set()
            rt.close()

    def request_stop(self, reason: str = "stop requested") -> None:
        """Safe from a signal handler: stop at the next safe point; dispatched, untrained groups go back."""
        if self.stop_event.is_set():
            return
        self.stop_event.set()
        # Work happens on a thread: the handler may have interrupted the main thread inside emit().
        self._stopper = threading.Thread(target=self._close_for_stop, args=(reason,), daemon=True)
        self._stopper.start()

    def _close_for_stop(self, reason: str) -> None:
        self._emit("log", {"level": "warning", "message": f"stopping: {reason}"})
        if self.rt is not None:
            # Closing the scheduler wakes a driver blocked in generate() and returns every group that was
            # dispatched but not trained on to the sampler, so the stop checkpoint loses none of them.
            self.rt.scheduler.close(timeout_s=10)

    # --- steps --------------------------------------------------------------------------------------------
    def _collect_batch(self) -> list[Group]:
        rt, cfg = self.rt, self.cfg
        t0 = time.monotonic()
        prefetch = cfg.max_staleness * cfg.prompts_per_step
        batch = rt.scheduler.generate(self.version, prefetch=prefetch)
        groups = sorted((r.payload for r in batch.groups), key=lambda g: g.group_id)
        # Staleness guard: groups older than allowed go back to the sampler and are generated again.
        floor = self.version - cfg.max_staleness
        stale = [g for g in groups if g.min_version < floor]
        if stale:
            self.sampler.return_groups([GroupTicket(g.group_id, g.epoch, g.prompt_index) for g in stale])
            groups = [g for g in groups if g.min_version >= floor]
        if batch.aborted:
            self._find_dead_engines()
        n_dropped = sum(batch.dropped.values())
        rewards = [r for g in groups for r in g.rewards]
        self._emit("rollout", {
            "step": self.version + 1, "groups": len(groups), "samples": len(rewards),
            "group_ids": [g.group_id for g in groups], "epochs": [g.epoch for g in groups],
            "dropped": batch.dropped, "filtered_rate": n_dropped / max(1, n_dropped + len(batch.groups)),
            "aborted": batch.aborted, "stale": len(stale), "seconds": time.monotonic() - t0,
            "reward_mean": sum(rewards) / max(1, len(rewards)),
            "min_token_version": min((g.min_version for g in groups), default=self.version),
            "engines": sorted({e for g in groups for e in g.engines}),
        })
        self.metrics["filtered_rate"] = n_dropped / max(1, n_dropped + len(batch.groups))
        return groups

    def _train(self, groups: list[Group]) -> dict[str, Any]:
        stats = self.rt.train_step(groups)
        self.version = stats["version"]
        self.consumed += [(g.group_id, g.epoch) for g in groups]
        self.samples += sum(len(g.rewards) for g in groups)
        return stats

    def _seal_if_colocated(self) -> None:
        if self.cfg.mode == "colocated":
            self._gate_closed_at = time.monotonic()
            self._prepare()
            self._emit_gate()

    def _publish(self) -> None:
        rt = self.rt
        if not rt.publication.prepared:
            self._gate_closed_at = time.monotonic()
            self._prepare()
        for attempt in range(3):
            weights = rt.trainer.weights.remote() if rt.uses_ray else rt.trainer.weights()
            try:
                rt.loop.run(rt.publication.publish(self.version, timeout_s=self.cfg.publish_deadline_s,
                                                   weights=weights))
                break
            except PublicationError:
                if not self._find_dead_engines() or attempt == 2:
                    raise
                self._prepare()  # the engine set changed: freeze the survivors again
        pause = time.monotonic() - self._gate_closed_at
        self.gate_closed_s += pause
        self._emit("version", {"version": self.version, "published_at": time.time(), "pause_ms": pause * 1000})
        self._emit_gate()

    def _prepare(self) -> None:
        rt = self.rt
        try:
            rt.loop.run(rt.publication.prepare(timeout_s=self.cfg.publish_deadline_s))
        except PublicationError:
            if not self._find_dead_engines():
                raise
            rt.loop.run(rt.publication.prepare(timeout_s=self.cfg.publish_deadline_s))

    def _report(self, groups: list[Group], stats: dict[str, Any]) -> None:
        cfg = self.cfg
        elapsed = time.monotonic() - self._t0
        data = {
            "step": self.version, "loss": stats["loss"], "reward_mean": stats["reward_mean"],
            "exact_match": stats["exact_match"], "kl": stats["kl"], "entropy": stats["entropy"],
            "staleness_max": max((self.version - 1 - g.min_version for g in groups), default=0),
            "pg_loss": stats["pg_loss"], "clip_frac": stats["clip_frac"], "grad_norm": stats["grad_norm"],
            "filtered_rate": self.metrics.get("filtered_rate", 0.0), "groups": len(groups),
            "group_ids": [g.group_id for g in groups], "epochs": [g.epoch for g in groups],
            "train_seconds": stats["train_seconds"], "elapsed_s": elapsed,
            "samples_per_s": self.samples / max(elapsed, 1e-9), "gate_closed_share": self.gate_closed_s / max(elapsed, 1e-9),
        }
        if cfg.eval_every and (self.version % cfg.eval_every == 0 or self.version == cfg.steps):
            data.update(self.rt.trainer_call("evaluate", cfg.eval_prompts))
        self.metrics.update({k: v for k, v in data.items() if k not in ("group_ids", "epochs")})
        self._emit("train", data)
        self._emit("sampler", self.sampler.progress())

    def _target_reached(self) -> bool:
        cfg = self.cfg
        if cfg.time_limit_s and time.monotonic() - self._t0 >= cfg.time_limit_s:
            return True
        return bool(cfg.target_exact_match and self.metrics.get("train_exact_match", 0.0) >= cfg.target_exact_match)

    # --- engines ------------------------------------------------------------------------------------------
    def _find_dead_engines(self) -> list[str]:
        """Drop engines that stopped answering: their sessions are tombstoned, the run continues without them."""
        rt = self.rt
        dead = [e for e in list(rt.engines) if not rt.engine_alive(e)]
        for engine_id in dead:
            rt.publication.remove_engine(engine_id)
            del rt.engines[engine_id]
            rt.workers_call("engine_lost", engine_id, "engine actor died")
            tombstones = sum(s["router"]["tombstones"] for s in rt.workers_call("stats"))
            self._emit("worker", {"event": "engine_lost", "engine": engine_id, "engines": sorted(rt.engines),
                                  "tombstoned_sessions": tombstones})
        if dead and not rt.engines:
            raise RuntimeError("every engine died")
        return dead

    # --- checkpoints, stop, restore -----------------------------------------------------------------------
    def _checkpoint(self, reason: str, quiesce: bool = True) -> None:
        if not self.checkpoint_dir:
            return
        rt, t0 = self.rt, time.monotonic()
        scheduler_state = None
        if quiesce:
            rt.scheduler.pause(drain=True)  # in-flight groups finish into `ready` (gates are still open)
            self._prepare()  # seal + drain every engine: nothing is generating while we save
            scheduler_state = scheduler_state_to_plain(rt.scheduler.state_dict())
        state = {"trainer": rt.trainer_call("state_dict"), "sampler": self.sampler.state_dict(),
                 "scheduler": scheduler_state, "python_rng": random.getstate(), "torch_rng": torch.get_rng_state(),
                 "consumed": list(self.consumed)}
        meta = {"version": self.version, "config": self.cfg.to_dict(), "sampler": self.sampler.progress(),
                "reason": reason}
        path = checkpoint_save(self.checkpoint_dir, step=self.version, meta=meta, state=state)
        if quiesce:
            rt.loop.run(rt.publication.resume())
            rt.scheduler.resume()
        self.last_checkpoint = str(path)
        self._checkpointed_version = self.version
        self._emit("checkpoint", {"step": self.version, "version": self.version, "path": str(path),
                                  "reason": reason, "seconds": time.monotonic() - t0})

    def _stop(self) -> RunResult:
        self._emit("status", {"status": "stopping", "version": self.version})
        if self._stopper is not None:
            self._stopper.join(timeout=15)
        if self.rt is not None:
            self.rt.scheduler.close(timeout_s=10)  # idempotent: every untrained group is back in the sampler
        if self.checkpoint_dir and self.version > 0:
            # The scheduler is closed: every untrained group is back in the sampler, so its state suffices.
            self._checkpoint("stop", quiesce=False)
        self._emit("status", {"status": "cancelled", "version": self.version, "metrics": self.metrics})
        return self._result("cancelled")

    def _check_stop(self) -> None:
        if self.emitter.stop_requested:
            self.request_stop("the platform says the run is finished (HTTP 409)")
        if self.stop_event.is_set():
            raise StopRequested()

    def _restore_state(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        if not (self.resume and self.checkpoint_dir and checkpoint_latest(self.checkpoint_dir)):
            return None
        meta, state = checkpoint_load(self.checkpoint_dir)
        self.sampler.load_state_dict(state["sampler"])
        self.version = meta["version"]
        self.consumed = [tuple(c) for c in state.get("consumed", [])]
        random.setstate(state["python_rng"])
        return meta, state

    def _apply_restore(self, restored: tuple[dict[str, Any], dict[str, Any]]) -> None:
        """Engines were started closed: load the trainer, then install the restored weights, then reopen."""
        meta, state = restored
        rt = self.rt
        self._emit_gate()  # sealed at version 0: nothing is generated before the restored weights are in
        rt.trainer_call("load_state_dict", state["trainer"])
        if state.get("scheduler"):
            rt.scheduler.load_state_dict(scheduler_state_from_plain(state["scheduler"]))
        self._gate_closed_at = time.monotonic()
        self._prepare()
        self._publish()
        self._emit("checkpoint", {"step": self.version, "version": self.version, "reason": "restored",
                                  "path": str(checkpoint_latest(self.checkpoint_dir))})
        self._emit("sampler", self.sampler.progress())

    # --- reporting ----------------------------------------------------------------------------------------
    def _emit(self, type_: str, data: dict[str, Any]) -> None:
        self.emitter.emit(type_, data)

    def _emit_gate(self) -> None:
        snap = self.rt.loop.run(self.rt.publication.snapshot())
        engines = [{k: e.get(k) for k in ("engine", "state", "version", "active", "waiting", "sessions")}
                   for e in snap["engines"]]
        self._emit("gate", {**snap, "engines": engines})

    def _emit_gate_quietly(self) -> None:
        try:
            self._emit_gate()
        except Exception:  # noqa: BLE001 - reporting must not mask the run's own error
            pass

    def _heartbeat(self) -> None:
        """The platform treats any event as a heartbeat: say something at least every 2 s."""
        while not self.stop_event.wait(0.5):
            if time.monotonic() - self.emitter.last_emit >= 2.0:
                self._emit("sampler", self.sampler.progress())

    def _result(self, status: str) -> RunResult:
        return RunResult(status=status, version=self.version, metrics=dict(self.metrics),
                         consumed=list(self.consumed), checkpoint=self.last_checkpoint)
