"""Debug phases of a disaggregated setup: generate and save one batch, or train one step from a saved batch.

They reuse the run's own machinery (scheduler, engines, trainer, publication), so a batch saved by
`rollout_only` trains under `train_only` exactly as it would have in the loop. They are for local runs of
`python -m trainer run`: the platform refuses them (`TrainConfig.from_dict(..., allow_debug=False)`, and the
CLI's `--sandboxed`). The batch file holds plain data only (groups as dicts) and is read with
`torch.load(weights_only=True)`, so loading one cannot run code. They use only the public steps of
`TrainingRun` (collect_batch, train_step, train_given, publish, report, checkpoint, emit, result).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainer.plain import groups_from_plain, groups_to_plain

if TYPE_CHECKING:
    from trainer.loop import RunResult, TrainingRun


def run_debug_phase(run: TrainingRun) -> RunResult:
    if run.cfg.phase == "rollout_only":
        return rollout_only(run)
    if run.cfg.phase == "train_only":
        return train_only(run)
    raise ValueError(f"phase: unknown debug phase {run.cfg.phase!r}")


def rollout_only(run: TrainingRun) -> RunResult:
    """Generate one batch at the current version and save it (groups with tokens, log-probs, versions)."""
    groups = run.collect_batch()
    path = Path(run.cfg.batch_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"groups": groups_to_plain(groups), "version": run.version, "config": run.cfg.to_dict()}, path)
    run.emit("log", {"level": "info", "message": f"saved {len(groups)} groups to {path}"})
    run.emit("status", {"status": "succeeded", "version": run.version})
    return run.result("succeeded")


def train_only(run: TrainingRun) -> RunResult:
    """Train one step from a saved batch, publish it, report, checkpoint when a directory is given."""
    saved = torch.load(run.cfg.batch_path, weights_only=True)
    groups = groups_from_plain(saved["groups"])
    stats = run.train_given(groups)
    run.publish()
    run.report(groups, stats)
    if run.checkpoint_dir:
        run.checkpoint("final")
    run.emit("status", {"status": "succeeded", "version": run.version, "metrics": run.metrics})
    return run.result("succeeded")
