"""Publishing a weight version to every engine: seal and drain, install the trainer's weights, reopen.

The loop's `publish` and `seal_engines` steps are these functions. Engines that stopped answering are dropped on
the way (their sessions tombstoned, the run continues on the survivors) and restarted between publications, at
the run's version (`restart_lost_engines`, trainer/engine_restart.py); a poisoned gate waits for a staff reset
(trainer/controls.py). They use only the public members of the run.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rollout.errors import PublicationError
from trainer import reports
from trainer.controls import await_gate_reset, gate_poisoned
from trainer.engine_restart import restart_engine

if TYPE_CHECKING:
    from trainer.loop import TrainingRun


def publish(run: TrainingRun) -> None:
    """Stage the trainer's weights on every engine while the gates are open, seal and drain every engine (unless
    already sealed), install the weights, reopen."""
    rt = run.rt
    weights = rt.trainer.weights.remote() if rt.uses_ray else rt.trainer.weights()
    # Open gates (disaggregated): the weights go to the engines first, while they serve; the install under the
    # closed gates is then a swap (measured: the install phase was ~17 ms of a ~30 ms pause, the load 0.5 ms of
    # it, the rest the transfer). Closed already (colocated) or in-process engines: sent with the install.
    staged = False
    if rt.uses_ray and not rt.publication.prepared:
        staged = stage_weights(run, weights)
    if not rt.publication.prepared:
        run.gate_closed_at = time.monotonic()
        run.seal_engines()
    for attempt in range(3):
        install = {"staged": True} if staged and attempt == 0 else {"weights": weights}
        try:
            rt.loop.run(rt.publication.publish(run.version, timeout_s=run.cfg.publish_deadline_s, **install))
            break
        except PublicationError as exc:
            if find_dead_engines(run) and attempt < 2:
                run.seal_engines()  # the engine set changed: freeze the survivors again
                continue
            if gate_poisoned(run) and await_gate_reset(run, exc, reopen=True):
                break  # staff reset the gate: the engines were re-checked and now serve this version
            raise
    pause = time.monotonic() - run.gate_closed_at
    run.gate_closed_s += pause
    phases = {k: reports.span(*v) for k, v in rt.publication.timings.items()}
    counts = rt.publication.counts()
    run.emit(
        "version",
        {
            "version": run.version,
            "published_at": time.time(),
            "pause_ms": pause * 1000,  # gates closed: seal -> reopen (colocated: the training step included)
            "drain_ms": run.drain_ms,  # seal -> every in-flight request finished
            "phases": phases,
            "drained": counts["drained"],  # leases in flight that the drains waited for, all engines
            "admitted_at_reopen": counts["admitted_at_reopen"],  # requests that waited at the closed gates
            "engines": counts["engines"],  # the same per engine
        },
    )
    run.emit_gate()
    restart_lost_engines(run)  # the publication is over: a lost engine comes back at this version


def stage_weights(run: TrainingRun, weights: object) -> bool:
    """Send `weights` (the next version's) to every engine ahead of its install. False: some engine did not take
    them (one may have died: sealing finds it), and the install sends them in full."""
    try:
        run.rt.loop.run(run.rt.publication.stage(run.version, timeout_s=run.cfg.publish_deadline_s, weights=weights))
    except PublicationError:
        return False
    return True


def seal_engines(run: TrainingRun) -> None:
    """Seal and drain every engine (dead ones are dropped and the survivors sealed again; a poisoned gate
    waits for a staff reset, trainer/controls.py)."""
    rt, t0 = run.rt, time.monotonic()
    try:
        rt.loop.run(rt.publication.prepare(timeout_s=run.cfg.publish_deadline_s))
    except PublicationError as exc:
        if find_dead_engines(run):
            rt.loop.run(rt.publication.prepare(timeout_s=run.cfg.publish_deadline_s))
        elif not (gate_poisoned(run) and await_gate_reset(run, exc, reopen=False)):
            raise
    run.drain_ms = (time.monotonic() - t0) * 1000


def find_dead_engines(run: TrainingRun) -> list[str]:
    """Drop engines that stopped answering: their sessions are tombstoned, the run continues without them until
    each is restarted (at once between publications, else after the publication in progress)."""
    rt = run.rt
    dead = [e for e in list(rt.engines) if not rt.engine_alive(e)]
    for engine_id in dead:
        rt.publication.remove_engine(engine_id)
        del rt.engines[engine_id]
        rt.workers_call("engine_lost", engine_id, "engine actor died")
        rt.servers_call("engine_lost", engine_id, "engine actor died")
        tombstones = sum(s["router"]["tombstones"] for s in rt.workers_call("stats"))
        run.emit(
            "worker",
            {
                "event": "engine_lost",
                "engine": engine_id,
                "engines": sorted(rt.engines),
                "tombstoned_sessions": tombstones,
            },
        )
        run.lost_engines.add(engine_id)
    if not rt.publication.prepared:
        restart_lost_engines(run)
    if dead and not rt.engines:
        raise RuntimeError("every engine died")
    return dead


def restart_lost_engines(run: TrainingRun) -> None:
    """A fresh engine for each lost one, at the run's version, back in the publication and every worker's
    routing (`worker` event `engine_restarted`); one that cannot start is reported (`engine_restart_failed`)
    and the run goes on without it. Only between publications."""
    rt = run.rt
    for engine_id in sorted(run.lost_engines):
        run.lost_engines.discard(engine_id)
        try:
            snap = restart_engine(rt, engine_id, run.version, timeout_s=run.cfg.publish_deadline_s)
        except Exception as exc:  # noqa: BLE001 - the run goes on with the engines it has
            failed = {"event": "engine_restart_failed", "engine": engine_id, "error": str(exc)[:500]}
            run.emit("worker", {**failed, "engines": sorted(rt.engines)})
            continue
        run.emit(
            "worker",
            {
                "event": "engine_restarted",
                "engine": engine_id,
                "version": snap["version"],
                "engines": sorted(rt.engines),
                "restarts": rt.restarts,
            },
        )
