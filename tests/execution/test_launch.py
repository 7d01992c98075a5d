"""The launcher against the real Ray job API: a second launch of the same attempt is a no-op (one job), the job
gets the run's token (in a 0600 file, not its env), event URL and stop grace, and the rl_train job spec carries
--resume and the entrypoint's reservation (the driver bundle), and each kind declares its demand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.utils import timezone
from ray.job_submission import JobSubmissionClient

from runs.execution.jobs import JobSpec, eval_job, rl_train_job
from runs.execution.kinds import kind_get
from runs.execution.launch import job_stop, run_launch_job
from runs.execution.ray import submission_id_for
from runs.models import Run, RunStatus, Slot, SlotState

pytestmark = pytest.mark.django_db(transaction=True)


def _starting_run(user, **fields) -> Run:
    now = timezone.now()
    run = Run.objects.create(
        name="l",
        origin="api",
        run_class="app",
        kind="rl_train",
        owner=user,
        status=RunStatus.STARTING,
        granted_at=now,
        **fields,
    )
    Slot.objects.create(run=run, run_class="app", state=SlotState.HELD, requested_at=now, granted_at=now)
    return run


def test_second_launch_is_a_no_op(ray_settings, settings, django_user_model, submission_prefix, tmp_path, monkeypatch):
    settings.PLATFORM_PUBLIC_URL = "http://platform.example:8000"
    settings.RUN_ARTIFACTS_DIR = tmp_path
    submitted: list[dict] = []  # what the launcher asked Ray for (the job API does not list entrypoint resources)
    submit = JobSubmissionClient.submit_job
    monkeypatch.setattr(
        JobSubmissionClient, "submit_job", lambda self, **kw: submitted.append(kw) or submit(self, **kw)
    )
    run = _starting_run(django_user_model.objects.create_user(username="l1"))
    spec = JobSpec(entrypoint=["sleep", "60"], entrypoint_num_cpus=0.2, entrypoint_memory=64 * 1024 * 1024)

    run_launch_job(run, spec)
    run_launch_job(Run.objects.get(pk=run.pk), spec)  # e.g. a redelivered task: the job exists, just recorded
    run_launch_job(Run.objects.get(pk=run.pk), spec)  # the lost-launch sweep: the same

    client = JobSubmissionClient(ray_settings.dashboard_url)
    jobs = [j for j in client.list_jobs() if (j.metadata or {}).get("platform_run") == str(run.pk)]
    run.refresh_from_db()
    try:
        assert [j.submission_id for j in jobs] == [f"{submission_prefix}-{run.pk}-0"] == [run.ray_submission_id]
        assert run.status == RunStatus.STARTING  # `running` comes from the job's report, not from the launcher
        env = jobs[0].runtime_env["env_vars"]
        assert env["RUN_ID"] == str(run.pk)
        # The token is in a 0600 file the job reads, never in what the job API shows to anyone listing jobs.
        token_file = Path(env["RUN_INGEST_TOKEN_FILE"])
        assert token_file.read_text() == run.ingest_token and token_file.stat().st_mode & 0o777 == 0o600
        assert run.ingest_token not in json.dumps([jobs[0].runtime_env, jobs[0].metadata, jobs[0].entrypoint])
        # The serving key (what the proxy shows the run's session server) travels the same way.
        key_file = Path(env["RLCP_SERVING_KEY_FILE"])
        key = run.serving_keys()[0]
        assert key_file.read_text() == key and key_file.stat().st_mode & 0o777 == 0o600 and key != run.ingest_token
        assert key not in json.dumps([jobs[0].runtime_env, jobs[0].metadata, jobs[0].entrypoint])
        assert env["RAY_JOB_STOP_WAIT_TIME_S"] == str(settings.RUN_STOP_GRACE_SECONDS)
        assert env["RAY_JOB_STOP_SIGNAL"] == "SIGINT"
        # The entrypoint (the job's driver) reserves its bundle; no GPU asked, none reserved.
        reserved = {k: v for k, v in submitted[0].items() if k.startswith("entrypoint_")}
        assert reserved == {
            "entrypoint_num_cpus": 0.2,
            "entrypoint_num_gpus": None,
            "entrypoint_memory": 64 * 1024 * 1024,
        }
    finally:
        job_stop(run)


def test_rl_train_job_spec(settings, tmp_path, django_user_model):
    settings.RUN_ARTIFACTS_DIR = tmp_path
    settings.PLATFORM_PUBLIC_URL = "https://rl.example.com/"
    run = _starting_run(
        django_user_model.objects.create_user(username="l2"), config={"steps": 3}, attempt=2, resume_requested=True
    )
    spec = rl_train_job(run)
    assert spec.entrypoint == [
        "python",
        "-m",
        "trainer",
        "run",
        "--config",
        str(tmp_path / str(run.pk) / "config.json"),
        "--events",
        f"https://rl.example.com/api/runs/{run.pk}/ingest/",
        "--checkpoint-dir",
        str(tmp_path / str(run.pk) / "checkpoints"),
        "--sandboxed",
        "--resume",
    ]
    # job_spec is pure: the config is a file of the spec, written by the launcher before it submits.
    assert {path: json.loads(text) for path, text in spec.files.items()} == {
        str(tmp_path / str(run.pk) / "config.json"): {"steps": 3}
    }
    assert not (tmp_path / str(run.pk)).exists()
    assert submission_id_for(run).endswith(f"-{run.pk}-2")
    # The entrypoint reserves the driver bundle only: the actors are in the job's own placement group.
    mib = 1024 * 1024
    assert (spec.entrypoint_num_cpus, spec.entrypoint_num_gpus, spec.entrypoint_memory) == (0.2, 0.0, 512 * mib)
    run.config = {"mode": "local", "learner_gpus": 1, "driver_cpus": 0.5, "actor_memory_mb": 256}
    local = rl_train_job(run)  # one process: the driver also reserves the learner's share and its GPU
    assert (local.entrypoint_num_cpus, local.entrypoint_num_gpus, local.entrypoint_memory) == (0.75, 1, 256 * mib)
    run.config = {"source_run": 1}
    ev = eval_job(run)
    assert (ev.entrypoint_num_cpus, ev.entrypoint_num_gpus, ev.entrypoint_memory) == (0.5, 0.0, 512 * mib)


def test_kinds_declare_their_demand() -> None:
    mib = 1024 * 1024
    demand = kind_get("rl_train").demand(
        {"num_engines": 1, "num_workers": 3, "engine_gpus": 1, "placement_strategy": "SPREAD"}
    )
    assert [b["role"] for b in demand["bundles"]] == [
        "driver",
        "learner",
        "channel",
        "engine-0",
        "worker-0",
        "worker-1",
        "worker-2",
    ]
    assert demand["strategy"] == "SPREAD"
    assert demand["total"] == {"CPU": round(0.2 + 0.25 + 0.05 + 0.4 + 3 * 0.35, 4), "GPU": 1.0, "memory": 7 * 512 * mib}
    assert kind_get("rl_train").demand({})["total"]["CPU"] == 2.0  # the default colocated run: two CPUs
    assert kind_get("eval").demand({"source_run": 3}) == {
        "bundles": [{"role": "driver", "CPU": 0.5, "GPU": 0.0, "memory": 512 * mib}],
        "total": {"CPU": 0.5, "GPU": 0.0, "memory": 512 * mib},
        "strategy": "PACK",
    }


def test_a_launch_read_before_a_requeue_submits_nothing(django_user_model, monkeypatch):
    """A dispatch read the run at attempt 0; the run was requeued and granted again (attempt 1) before it
    submitted. It must not submit attempt 0's job, nor record that job's id on the run: attempt 1's own task
    launches it."""
    from runs.execution import ray as ray_module

    monkeypatch.setattr(ray_module, "job_submit", lambda run, spec: pytest.fail(f"submitted {run.ray_submission_id}"))
    run = _starting_run(django_user_model.objects.create_user(username="l3"))
    stale = Run.objects.get(pk=run.pk)
    Run.objects.filter(pk=run.pk).update(attempt=1, ray_submission_id="")  # requeued and granted again meanwhile
    run_launch_job(stale, JobSpec(entrypoint=["sleep", "60"], entrypoint_num_cpus=0.2, entrypoint_memory=1 << 26))
    assert Run.objects.values_list("status", "attempt", "ray_submission_id").get(pk=run.pk) == (
        RunStatus.STARTING,
        1,
        "",
    )
