"""Publishing a weight version to every engine: seal and drain, install the trainer's weights, reopen.

The loop's `publish` and `seal_engines` steps are these functions. Engines that stopped answering are dropped on
the way (their sessions tombstoned, the run continues on the survivors); a poisoned gate waits for a staff
reset (trainer/controls.py). They use only the public members of the run.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rollout.errors import PublicationError
from trainer import reports
from trainer.controls import await_gate_reset, gate_poisoned

if TYPE_CHECKING:
    from trainer.loop import TrainingRun


def publish(run: TrainingRun) -> None:
    """Seal and drain every engine (unless already sealed), install the trainer's weights, reopen."""
    rt = run.rt
    if not rt.publication.prepared:
        run.gate_closed_at = time.monotonic()
        run.seal_engines()
    for attempt in range(3):
        weights = rt.trainer.weights.remote() if rt.uses_ray else rt.trainer.weights()
        try:
            rt.loop.run(rt.publication.publish(run.version, timeout_s=run.cfg.publish_deadline_s, weights=weights))
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
    run.emit(
        "version",
        {
            "version": run.version,
            "published_at": time.time(),
            "pause_ms": pause * 1000,  # gates closed: seal -> reopen (colocated: the training step included)
            "drain_ms": run.drain_ms,  # seal -> every in-flight request finished
            "phases": phases,
        },
    )
    run.emit_gate()


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
    """Drop engines that stopped answering: their sessions are tombstoned, the run continues without them."""
    rt = run.rt
    dead = [e for e in list(rt.engines) if not rt.engine_alive(e)]
    for engine_id in dead:
        rt.publication.remove_engine(engine_id)
        del rt.engines[engine_id]
        rt.workers_call("engine_lost", engine_id, "engine actor died")
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
    if dead and not rt.engines:
        raise RuntimeError("every engine died")
    return dead
