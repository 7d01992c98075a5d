"""Staff commands a running job applies. Today one: `gate_reset`, the way out of a poisoned gate.

A poisoned gate means some request's outcome is unknown; no weight version may be installed until someone
who knows decides (rollout/gate.py). Instead of failing at once, the driver posts the poisoned `gate` event and
a `log` saying it waits, and waits up to `poison_wait_s` for a `gate_reset` command (staff press the button on
the run page; runs/execution/controls.py delivers it in the replies to the job's own posts: `EventEmitter.commands`).
Before reopening it re-checks the weight version of every engine: they must all hold the same version, not
newer than the trainer's. Then every gate is reset, sealed and drained again, and the trainer's version is
installed (or, when the engines already hold it, they just reopen). Every command is answered with a
`control` event: applied, or refused with the reason (the wait goes on until the deadline).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from trainer.events import ControlCommand

if TYPE_CHECKING:
    from trainer.loop import TrainingRun

POLL_S = 0.25


def gate_poisoned(run: TrainingRun) -> bool:
    snap = run.rt.loop.run(run.rt.publication.snapshot())
    return any(e.get("state") == "poisoned" for e in snap["engines"])


def await_gate_reset(run: TrainingRun, error: BaseException, *, reopen: bool) -> bool:
    """The gate is poisoned: wait for a staff reset and apply it. True when applied (engines open at the run's
    version with `reopen`, else sealed, drained and frozen for the publication); False when none came in time."""
    cfg = run.cfg
    run.emit_gate()
    if cfg.poison_wait_s <= 0:
        return False
    run.emit(
        "log",
        {"level": "error", "message": f"gate poisoned ({error}); waiting {cfg.poison_wait_s:g} s for a staff reset"},
    )
    deadline = time.monotonic() + cfg.poison_wait_s
    while time.monotonic() < deadline and not run.stop_control.is_set() and not run.emitter.stop_requested:
        for command in run.emitter.commands():
            if command["id"] in run.answered_commands:
                continue
            run.answered_commands.add(command["id"])
            outcome, detail = apply_command(run, command, reopen=reopen)
            run.emit("control", {"id": command["id"], "kind": command["kind"], "outcome": outcome, "detail": detail})
            run.emit_gate()
            if outcome == "applied":
                return True
        time.sleep(POLL_S)
    return False


def apply_command(run: TrainingRun, command: ControlCommand, *, reopen: bool) -> tuple[str, str]:
    """(outcome, detail) of one command: `applied`, or `refused` with why."""
    if command["kind"] != "gate_reset":
        return "refused", f"unknown command {command['kind']!r}"
    rt = run.rt
    snap = rt.loop.run(rt.publication.snapshot())
    versions = {str(e.get("engine")): e.get("version") for e in snap["engines"]}
    held = set(versions.values())
    if len(held) != 1 or None in held:
        return "refused", f"engines hold different weight versions {versions}: not reopened"
    installed = held.pop()
    if not isinstance(installed, int) or installed > run.version:
        return "refused", f"engines hold v{installed}, newer than the trainer's v{run.version}: not reopened"
    reason = f"staff reset by {command['requested_by']}: {command['reason']}"
    rt.loop.run(rt.publication.reset(reason))
    run.seal_engines()  # seal + drain every gate again under the publish deadline
    if reopen:
        if installed < run.version:
            weights = rt.trainer.weights.remote() if rt.uses_ray else rt.trainer.weights()
            rt.loop.run(rt.publication.publish(run.version, timeout_s=run.cfg.publish_deadline_s, weights=weights))
        else:
            rt.loop.run(rt.publication.resume())
    rt.workers_call("resume_engines")  # workers route new sessions to the reset engines again
    return "applied", f"every engine held v{installed}; gates reset by {command['requested_by']}"
