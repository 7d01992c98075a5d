"""The driver loop of a training run: collect a batch -> train -> publish v+1 -> report -> checkpoint.

Reads top to bottom like the algorithm. Each step is a public method, so the debug phases
(`trainer.phases`) run the same steps one at a time. Where things run is `trainer.topology`; publishing a
version (seal, drain, install, reopen; dead engines dropped) is `trainer.publishing`; checkpoint and restore are
`trainer.resume`; stop requests are `trainer.stopping`; reporting a trained step (train, sample, sampler and
agents events, the evaluation) is `trainer.step_report`; the data of the rollout, train and gate events is built
by `trainer.reports`; everything the run reports goes through the injected `EventEmitter`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollout.scheduler import RolloutScheduler
from trainer import publishing, reports, step_report
from trainer.agent_episodes import build_environment
from trainer.collect import collect
from trainer.config import TrainConfig
from trainer.data_path import response_len_max
from trainer.episodes import Group
from trainer.histograms import run_edges
from trainer.phases import run_debug_phase
from trainer.placement import PlacementTimeout
from trainer.problems import task_build
from trainer.resume import apply_restore, load_for_resume, take_checkpoint
from trainer.runtime import Runtime
from trainer.sampler import GroupSampler
from trainer.sinks import EventEmitter
from trainer.stopping import StopControl, StopRequested, finish_stopped
from trainer.topology import build_runtime

# RunResult.status of a run whose placement group was not ready in time: it trained nothing and exits 0.
PLACEMENT_TIMEOUT = "placement_timeout"


@dataclass
class RunResult:
    status: str  # succeeded | cancelled | failed | placement_timeout
    version: int
    metrics: dict[str, Any] = field(default_factory=dict)
    consumed: list[tuple[int, int]] = field(default_factory=list)  # (group_id, epoch) in training order
    checkpoint: str | None = None


class TrainingRun:
    def __init__(
        self,
        cfg: TrainConfig,
        *,
        emitter: EventEmitter | None = None,
        checkpoint_dir: str | None = None,
        resume: bool = False,
        on_step: Callable[[TrainingRun, list[Group]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.emitter = emitter or EventEmitter([])
        self.checkpoint_dir = checkpoint_dir
        self.resume = resume
        self.on_step = on_step
        self.task = task_build(cfg)
        # An agent environment's tasks replace the in-process task's prompts (trainer/agent_episodes.py).
        self.env = build_environment(cfg) if cfg.environment else None
        self.histogram_edges = run_edges(
            group_size=cfg.group_size,
            max_staleness=cfg.max_staleness,
            response_len_max=response_len_max(cfg),
        )
        tasks = len(self.env.tasks("train")) if self.env is not None else len(self.task.train_prompts)
        self.sampler = GroupSampler(tasks, cfg.seed)
        self.version = 0
        self.consumed: list[tuple[int, int]] = []
        self.metrics: dict[str, Any] = {}
        self.stop_control = StopControl(self.emit, self._scheduler_if_started)
        self.gate_closed_s = 0.0
        self.gate_closed_at = time.monotonic()  # when the engines were last sealed (the pause clock)
        self.drain_ms = 0.0  # how long the last seal + drain of every engine took
        self.answered_commands: set[int] = set()  # ids of the staff commands this job answered (controls.py)
        self.samples = 0
        self.last_checkpoint: str | None = None
        self.checkpointed_version = -1
        self.lost_engines: set[str] = set()  # engines that died, to restart between publications (publishing.py)
        self._rt: Runtime | None = None
        self._t0 = time.monotonic()

    @property
    def rt(self) -> Runtime:
        """Engines, workers, trainer, channel, publication and scheduler (started by `run`)."""
        if self._rt is None:
            raise RuntimeError("the run has not started its runtime yet")
        return self._rt

    @property
    def started(self) -> bool:
        return self._rt is not None

    # --- the algorithm ------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        cfg = self.cfg
        if self.stop_control.is_set():  # asked to stop before it started: nothing to build, train or save
            return finish_stopped(self)
        restored = load_for_resume(self)
        try:
            self._rt = rt = build_runtime(
                cfg, self.sampler, engines_open=restored is None, emit=self.emit, stop=self._stop_asked
            )
        except PlacementTimeout:
            return self.result(PLACEMENT_TIMEOUT)  # nothing trained; the platform requeues the run
        except StopRequested:
            return finish_stopped(self)
        heartbeat = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
        try:
            self.emit("status", {"status": "running", "version": self.version})
            if restored is not None:
                apply_restore(self, restored)
            self.emit(
                "worker",
                {
                    "event": "started",
                    "engines": sorted(rt.engines),
                    "workers": len(rt.workers),
                    "mode": cfg.mode,
                    **rt.trainer_resources,
                },
            )
            self.emit_gate()
            heartbeat.start()
            if cfg.phase != "full":
                return run_debug_phase(self)
            self._t0 = time.monotonic()
            while self.version < cfg.steps:
                self.stop_control.check(platform_says_finished=self.emitter.stop_requested)
                groups = self.collect_batch()  # rollout: G samples per prompt, filtered
                self._seal_if_colocated()  # colocated: generation pauses while training
                stats = self.train_step(groups)  # GRPO step -> version + 1
                self.publish()  # seal -> drain -> install v+1 -> reopen
                self.report(groups, stats)
                if self.on_step is not None:
                    self.on_step(self, groups)
                if cfg.checkpoint_every and self.version % cfg.checkpoint_every == 0:
                    self.checkpoint("periodic")
                if self._target_reached():
                    break
            if self.checkpoint_dir and self.checkpointed_version != self.version:
                self.checkpoint("final")
            self.emit("status", {"status": "succeeded", "version": self.version, "metrics": self.metrics})
            return self.result("succeeded")
        except Exception:
            # Closing the scheduler to stop may surface as any error of the step in progress.
            if not self.stop_control.is_set():
                self._emit_gate_quietly()  # e.g. a poisoned gate: the dashboard shows why the run failed
                raise
            return finish_stopped(self)
        finally:
            self.stop_control.event.set()
            # The platform has the run's final status before its session server goes: once it has, its proxy
            # answers "not serving" (404) rather than forwarding to a server that is gone (502).
            self.emitter.flush(timeout_s=5.0)
            rt.close()

    def request_stop(self, reason: str = "stop requested") -> None:
        """Safe from a signal handler: stop at the next safe point; dispatched, untrained groups go back."""
        self.stop_control.request(reason)

    def _stop_asked(self) -> bool:
        return self.stop_control.is_set() or self.emitter.stop_requested

    def _scheduler_if_started(self) -> RolloutScheduler | None:
        return self._rt.scheduler if self._rt is not None else None

    # --- steps --------------------------------------------------------------------------------------------
    def collect_batch(self) -> list[Group]:
        """Step 1: generate a batch at the current version (G samples per prompt, filtered, none too stale).

        The scheduler returns once the workers have put enough kept groups into the channel; the learner then
        takes a token-weighted batch of them and the scheduler's ledger claims what it took: too-stale groups go
        back to the sampler (generated again), a copy no receipt stands for is dropped (trainer/data_path.py),
        and every dropped group is replaced by a top-up, so the batch is exactly `prompts_per_step` groups unless
        the run is stopping (trainer/collect.py)."""
        rt = self.rt
        got = collect(rt, self.cfg, self.version, stopping=self._stop_asked)
        aborted_by: dict[str, int] = {}
        if got.batch.aborted:
            publishing.find_dead_engines(self)
            for stats in rt.workers_call("stats"):
                for kind, n in stats.get("aborted_by", {}).items():
                    aborted_by[kind] = aborted_by.get(kind, 0) + n
        data = reports.rollout_data(
            self.version + 1,
            self.version,
            got.groups,
            got.batch,
            got.stale,
            got.seconds,
            aborted_by,
            started_at=got.started_at,
        )
        data["channel"] = {**rt.channel.metrics(), **got.channel_counts()}
        self.emit("rollout", data)
        self.metrics["filtered_rate"] = reports.batch_filtered_rate(got.batch)
        return got.groups

    def train_step(self, groups: list[Group]) -> dict[str, Any]:
        """Step 2: one GRPO step on the learner's taken batch (these groups of it); the run's version becomes the
        trainer's (v + 1)."""
        started_at = time.time()
        return self._trained(groups, self.rt.train_taken(groups), started_at)

    def train_given(self, groups: list[Group]) -> dict[str, Any]:
        """Step 2 on a batch that did not come through the channel (a saved one: `phase: train_only`)."""
        started_at = time.time()
        return self._trained(groups, self.rt.trainer_call("train_step", groups), started_at)

    def _trained(self, groups: list[Group], stats: dict[str, Any], started_at: float) -> dict[str, Any]:
        stats = {**stats, "started_at": started_at, "ended_at": time.time()}
        self.version = stats["version"]
        self.consumed += [(g.group_id, g.epoch) for g in groups]
        self.samples += sum(len(g.rewards) for g in groups)
        return stats

    def _seal_if_colocated(self) -> None:
        if self.cfg.mode == "colocated":
            self.gate_closed_at = time.monotonic()
            self.seal_engines()
            self.emit_gate()

    def publish(self) -> None:
        """Step 3: seal and drain every engine (unless already sealed), install the trainer's weights, reopen;
        see `trainer.publishing`."""
        publishing.publish(self)

    def seal_engines(self) -> None:
        """Seal and drain every engine (dead ones dropped; a poisoned gate waits for a staff reset)."""
        publishing.seal_engines(self)

    def report(self, groups: list[Group], stats: dict[str, Any]) -> None:
        """Step 4: the train event (with an evaluation when due), captured samples, the sampler's progress and,
        for an agent environment, the agents event; see `trainer.step_report`."""
        step_report.report(self, groups, stats, elapsed=time.monotonic() - self._t0)

    def checkpoint(self, reason: str, *, quiesce: bool = True) -> None:
        """Step 5: save the run's state (nothing without a checkpoint directory); see `trainer.resume`."""
        take_checkpoint(self, reason, quiesce=quiesce)

    def _target_reached(self) -> bool:
        cfg = self.cfg
        if cfg.time_limit_s and time.monotonic() - self._t0 >= cfg.time_limit_s:
            return True
        return bool(cfg.target_exact_match and self.metrics.get("train_exact_match", 0.0) >= cfg.target_exact_match)

    # --- reporting ----------------------------------------------------------------------------------------
    def emit(self, type_: str, data: dict[str, Any]) -> None:
        self.emitter.emit(type_, data)

    def emit_gate(self) -> None:
        snap = self.rt.loop.run(self.rt.publication.snapshot())
        self.emit("gate", reports.gate_data(snap))

    def _emit_gate_quietly(self) -> None:
        try:
            self.emit_gate()
        except Exception:  # noqa: BLE001 - reporting must not mask the run's own error
            pass

    def _heartbeat(self) -> None:
        """The platform treats any event as a heartbeat: say something at least every 2 s."""
        while not self.stop_control.event.wait(0.5):
            if time.monotonic() - self.emitter.last_emit >= 2.0:
                self.emit("sampler", self.sampler.progress())

    def result(self, status: str) -> RunResult:
        """What `run` returns: the status, version, metrics, consumed groups and last checkpoint."""
        return RunResult(
            status=status,
            version=self.version,
            metrics=dict(self.metrics),
            consumed=list(self.consumed),
            checkpoint=self.last_checkpoint,
        )
