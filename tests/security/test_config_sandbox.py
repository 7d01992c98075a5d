"""Run configs stay inside the run's sandbox (issue 9, point 1; the bounds of point 2a are in test_config_bounds.py).

Through the REST API (`POST /api/runs/`): debug phases and `batch_path` are refused. Through the trainer CLI the
platform launches: no config can make the job write or unpickle a file, every `torch.load` refuses pickled
objects, and the only paths a job sees are chosen from the run id.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from django.utils import timezone

from runs.execution.jobs import rl_train_job
from runs.execution.launch import job_files_write
from runs.models import Run, RunStatus
from tests.runs.helpers import (  # noqa: F401 - fixtures
    _fast_password_hashing,
    _fresh_policy_cache,
    handoffs,
    other_user,
    user,
)
from tests.security.config_submit import ROOT, assert_refused, submit


def trainer_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


class Touch:
    """Unpickling this creates a file: the stand-in for arbitrary code in a pickle."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


@pytest.mark.django_db
@pytest.mark.parametrize(
    "config,field",
    [
        ({"phase": "rollout_only", "batch_path": "/tmp/owned.pt"}, "config.phase"),
        ({"phase": "train_only", "batch_path": "/tmp/owned.pt"}, "config.phase"),
        ({"phase": "rollout_only"}, "config.phase"),
        ({"batch_path": "/tmp/owned.pt"}, "config.batch_path"),
        ({"phase": "full", "batch_path": "../../etc/cron.d/x"}, "config.batch_path"),
    ],
)
def test_debug_phases_and_batch_path_are_refused_at_submit(user, handoffs, config, field):
    assert_refused(submit(user, config), field)
    assert not Run.objects.exists() and not handoffs.dispatched


@pytest.mark.django_db
def test_full_phase_with_empty_batch_path_is_accepted(user, handoffs):
    assert submit(user, {"phase": "full", "batch_path": ""}).status_code == 201


@pytest.mark.django_db
def test_every_free_string_in_the_schema_is_refused_unless_empty(user, handoffs):
    """The class, not the instance: any string field that is not an enum could become a path; none is accepted.
    The one free string besides `batch_path` is `environment`, a name checked against the registry (built-ins,
    installed entry points, staff-allowed module:Class paths: agents/environments.py): no path gets through."""
    from runs.execution.kinds import kind_get

    props = kind_get("rl_train").json_schema()["properties"]
    free = [name for name, prop in props.items() if prop["type"] == "string" and "enum" not in prop]
    assert sorted(free) == ["batch_path", "environment"] and props["batch_path"]["maxLength"] == 0
    assert props["phase"]["enum"] == ["full"]
    for name in free:
        assert_refused(submit(user, {name: "/var/lib/anything"}), f"config.{name}")
    for hostile in ("../../etc:passwd", "os:system", "agents.envs.digits:DigitsEnvironment", "x" * 201):
        assert_refused(submit(user, {"environment": hostile}), "config.environment")


@pytest.mark.django_db
def test_eval_source_run_must_be_an_id_not_a_path(user, handoffs):
    for bad in ("../1", "/var/runs/1/checkpoints", 1.5, True, 0):
        assert_refused(submit(user, {"source_run": bad}, kind="eval"), "config.source_run")
    assert_refused(submit(user, {"source_run": 1, "checkpoint": "/x"}, kind="eval"), "config.checkpoint")


@pytest.mark.django_db
def test_launched_job_gets_only_run_id_paths_and_refuses_a_stored_debug_config(user, settings, tmp_path):
    """A config stored before the submit check (or by any path around it) still cannot name a file: the job
    is launched with --sandboxed and every path in its command line is under RUN_ARTIFACTS_DIR/<run id>."""
    settings.RUN_ARTIFACTS_DIR = tmp_path / "artifacts"
    target = tmp_path / "written-by-the-cluster.pt"
    run = Run.objects.create(
        name="old",
        origin="api",
        run_class="app",
        kind="rl_train",
        owner=user,
        status=RunStatus.STARTING,
        granted_at=timezone.now(),
        resume_requested=True,
        config={"mode": "local", "steps": 1, "phase": "rollout_only", "batch_path": str(target)},
    )
    spec = rl_train_job(run)
    job_files_write(run, spec)  # what the launcher does before it submits
    cmd = spec.entrypoint
    run_dir = (tmp_path / "artifacts" / str(run.pk)).resolve()
    paths = [cmd[i + 1] for i, arg in enumerate(cmd) if arg in ("--config", "--checkpoint-dir")]
    assert len(paths) == 2 and all(Path(p).resolve().is_relative_to(run_dir) for p in paths)
    assert "--sandboxed" in cmd and str(target) not in cmd
    events = tmp_path / "events.jsonl"
    args = [a for a in cmd[3:] if not a.startswith("http")]
    args[args.index("--events")] = "--events"
    args.insert(args.index("--events") + 1, str(events))
    proc = trainer_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "phase" in proc.stderr and not target.exists()


def test_checkpoint_load_never_unpickles_objects(tmp_path):
    """`python -m trainer eval` (what the eval kind runs) on a state.pt holding a pickled object: refused, and
    the object's code never runs."""
    ckpt, marker = tmp_path / "ckpt", tmp_path / "code-ran"
    step = ckpt / "step-000001"
    step.mkdir(parents=True)
    (ckpt / "latest").write_text("step-000001")
    (step / "meta.json").write_text(json.dumps({"format": 2, "step": 1, "version": 1, "config": {}}))
    torch.save({"trainer": Touch(marker)}, step / "state.pt")
    proc = trainer_cli("eval", "--checkpoint", str(ckpt), "--events", str(tmp_path / "e.jsonl"), cwd=tmp_path)
    assert proc.returncode == 1
    assert not marker.exists(), "torch.load ran code from the checkpoint"
    assert "weights_only" in proc.stderr or "Unpickl" in proc.stderr


def test_resume_never_unpickles_objects(tmp_path):
    ckpt, marker = tmp_path / "ckpt", tmp_path / "code-ran"
    step = ckpt / "step-000001"
    step.mkdir(parents=True)
    (ckpt / "latest").write_text("step-000001")
    (step / "meta.json").write_text(json.dumps({"format": 2, "step": 1, "version": 1, "config": {}}))
    torch.save({"sampler": Touch(marker)}, step / "state.pt")
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"mode": "local", "steps": 2, "prompts_per_step": 4, "group_size": 2, "eval_every": 0})
    )
    proc = trainer_cli(
        "run",
        "--config",
        str(config),
        "--checkpoint-dir",
        str(ckpt),
        "--resume",
        "--events",
        str(tmp_path / "e.jsonl"),
        cwd=tmp_path,
    )
    assert proc.returncode != 0 and not marker.exists(), proc.stderr[-2000:]


def test_local_train_only_never_unpickles_objects(tmp_path):
    """Even the local debug phase (allowed without --sandboxed) loads its batch with weights_only."""
    batch, marker = tmp_path / "batch.pt", tmp_path / "code-ran"
    torch.save({"groups": [Touch(marker)], "version": 0, "config": {}}, batch)
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "mode": "local",
                "steps": 1,
                "prompts_per_step": 4,
                "group_size": 2,
                "eval_every": 0,
                "phase": "train_only",
                "batch_path": str(batch),
            }
        )
    )
    proc = trainer_cli("run", "--config", str(config), "--events", str(tmp_path / "e.jsonl"), cwd=tmp_path)
    assert proc.returncode == 1 and not marker.exists(), proc.stderr[-2000:]


def test_latest_marker_cannot_lead_out_of_the_checkpoint_dir(tmp_path):
    """The eval kind reads RUN_ARTIFACTS_DIR/<source_run>/checkpoints; its `latest` file may only name a step
    directory inside it (not `..`, an absolute path or a symlink to another run's checkpoints)."""
    outside, marker = tmp_path / "other-run", tmp_path / "code-ran"
    (outside / "step-000001").mkdir(parents=True)
    (outside / "step-000001" / "meta.json").write_text(json.dumps({"step": 1, "version": 1, "config": {}}))
    torch.save({"trainer": Touch(marker)}, outside / "step-000001" / "state.pt")
    for i, name in enumerate(["../other-run/step-000001", str(outside / "step-000001"), "step-000002"]):
        ckpt = tmp_path / f"run{i}"
        ckpt.mkdir()
        if name == "step-000002":
            (ckpt / name).symlink_to(outside / "step-000001")
        (ckpt / "latest").write_text(name)
        proc = trainer_cli("eval", "--checkpoint", str(ckpt), "--events", str(tmp_path / "e.jsonl"), cwd=tmp_path)
        assert proc.returncode == 1 and "no checkpoint under" in proc.stderr, (name, proc.stderr[-2000:])
    assert not marker.exists()


def test_every_torch_load_in_the_repo_refuses_pickled_objects():
    """Source guard beside the behavioural tests above: a new torch.load must pass weights_only=True."""
    import re

    offenders = []
    for top in ("trainer", "rollout", "runs", "frontend", "config", "bench", "platform"):
        for path in (ROOT / top).rglob("*.py"):
            for match in re.finditer(r"torch\.load\((?:[^()]|\([^()]*\))*\)", path.read_text()):
                if "weights_only=True" not in match.group(0):
                    offenders.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert not offenders
