"""What each run kind asks Ray to run: `JobSpec` and the kinds' pure `job_spec(run)` functions, plus the
per-run paths they are built from. Nothing here writes a file or talks to Ray (runs/execution/launch.py does)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from runs.models import Run

if TYPE_CHECKING:
    from trainer.resources import Bundle


@dataclass(frozen=True)
class JobSpec:
    """One attempt's job: the entrypoint, extra env vars, what Ray reserves for the entrypoint (driver) process
    (the driver bundle of trainer/resources.py; 0 reserves nothing), and files the launcher writes (under the
    run's artifacts directory) before submitting."""

    entrypoint: list[str]
    env: dict[str, str] = field(default_factory=dict)
    entrypoint_num_cpus: float = 0.0
    entrypoint_num_gpus: float = 0.0
    entrypoint_memory: int = 0  # bytes
    files: dict[str, str] = field(default_factory=dict)  # absolute path -> content

    @classmethod
    def for_driver(cls, entrypoint: list[str], driver: Bundle, **fields: Any) -> JobSpec:
        """A job whose entrypoint reserves exactly the driver's bundle."""
        return cls(
            entrypoint=entrypoint,
            entrypoint_num_cpus=driver.cpus,
            entrypoint_num_gpus=driver.gpus,
            entrypoint_memory=driver.memory,
            **fields,
        )


def run_artifacts_dir(run_id: int) -> Path:
    """RUN_ARTIFACTS_DIR/<id>: the only place a run's job reads or writes files (config, checkpoints)."""
    if not isinstance(run_id, int) or isinstance(run_id, bool) or run_id < 1:
        raise ValueError(f"a run id is a positive integer, got {run_id!r}")
    return Path(settings.RUN_ARTIFACTS_DIR) / str(run_id)


def run_checkpoint_dir(run_id: int) -> Path:
    return run_artifacts_dir(run_id) / "checkpoints"


def run_events_url(run: Run) -> str:
    return f"{settings.PLATFORM_PUBLIC_URL.rstrip('/')}/api/runs/{run.pk}/ingest/"


def rl_train_job(run: Run) -> JobSpec:
    """`python -m trainer run`: the config is written next to the checkpoints (a shared path in production).

    Every path is chosen here from the run id; `--sandboxed` makes the job refuse a config that names a file
    (a debug phase, `batch_path`) even if one was stored before the submit check existed."""
    config_path = run_artifacts_dir(run.pk) / "config.json"
    cmd = [
        "python",
        "-m",
        "trainer",
        "run",
        "--config",
        str(config_path),
        "--events",
        run_events_url(run),
        "--checkpoint-dir",
        str(run_checkpoint_dir(run.pk)),
        "--sandboxed",
    ]
    if run.resume_requested:
        cmd.append("--resume")
    # The entrypoint reserves the driver bundle; the actors' bundles are the job's own placement group.
    from trainer.config import TrainConfig
    from trainer.resources import run_bundles

    driver = run_bundles(TrainConfig.from_dict(run.config, allow_debug=False))[0]
    return JobSpec.for_driver(cmd, driver, files={str(config_path): json.dumps(run.config, indent=2, sort_keys=True)})


def eval_job(run: Run) -> JobSpec:
    """`python -m trainer eval` of the source run's last checkpoint."""
    from trainer.resources import eval_bundles

    checkpoint = run_checkpoint_dir(run.config["source_run"])
    cmd = ["python", "-m", "trainer", "eval", "--checkpoint", str(checkpoint), "--events", run_events_url(run)]
    return JobSpec.for_driver(cmd, eval_bundles()[0])
