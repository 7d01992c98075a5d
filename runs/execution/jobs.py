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


def driver_bundle(run: Run) -> Bundle:
    """The driver's reservation: the first bundle of what admission charged (Run.resources, fixed at submit), so
    the job takes exactly what was granted. A run stored without resources gets its config's driver bundle (the
    config is checked again by the job, which runs --sandboxed)."""
    from trainer.config import TrainConfig
    from trainer.resources import Bundle, run_bundles

    bundles = run.resources.get("bundles") if isinstance(run.resources, dict) else None
    if bundles:
        first = bundles[0]
        return Bundle(str(first["role"]), float(first["CPU"]), float(first.get("GPU", 0)), int(first["memory"]))
    return run_bundles(TrainConfig.from_dict(run.config))[0]


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
    files = {str(config_path): json.dumps(run.config, indent=2, sort_keys=True)}
    return JobSpec.for_driver(cmd, driver_bundle(run), files=files)


def eval_job(run: Run) -> JobSpec:
    """`python -m trainer eval` of the source run's last checkpoint."""
    from trainer.resources import eval_bundles

    checkpoint = run_checkpoint_dir(run.config["source_run"])
    cmd = ["python", "-m", "trainer", "eval", "--checkpoint", str(checkpoint), "--events", run_events_url(run)]
    return JobSpec.for_driver(cmd, eval_bundles()[0])
