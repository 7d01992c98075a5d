"""`python -m trainer`: valid events, exit codes, stop on SIGTERM, eval of a checkpoint, debug phases."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.wait import wait_until
from trainer.events import HISTOGRAM_KEYS, REQUIRED_DATA_KEYS, validate_event

ROOT = Path(__file__).resolve().parents[2]
LOCAL = {
    "mode": "local",
    "steps": 4,
    "prompts_per_step": 8,
    "group_size": 4,
    "eval_every": 2,
    "eval_prompts": 16,
    "checkpoint_every": 2,
    "worker_capacity": 8,
    "num_engines": 2,
    "num_workers": 1,
}


def trainer_cli(*args: str, timeout: float = 120, **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen,
    )


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_config(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LOCAL, **changes}))
    return path


def test_run_writes_valid_events_then_eval_reads_the_checkpoint(tmp_path: Path) -> None:
    events_path, ckpt = tmp_path / "events.jsonl", tmp_path / "ckpt"
    proc = trainer_cli(
        "run", "--config", str(write_config(tmp_path)), "--events", str(events_path), "--checkpoint-dir", str(ckpt)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["status"] == "succeeded"
    events = read_events(events_path)
    for e in events:
        validate_event(e)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    types = {e["type"] for e in events}
    assert {"status", "gate", "version", "sampler", "rollout", "train", "worker", "checkpoint", "resources"} <= types
    # 'local' reserves no placement group: `ready` at once (no node outside Ray), then the run says it runs.
    assert events[0]["type"] == "resources" and events[0]["data"] | {"detail": ""} == {
        "state": "ready",
        "strategy": "PACK",
        "waited_s": 0.0,
        "nodes": [],
        "detail": "",
    }
    assert events[1]["data"]["status"] == "running" and events[-1]["data"]["status"] == "succeeded"
    trains = [e["data"] for e in events if e["type"] == "train"]
    assert [d["step"] for d in trains] == [1, 2, 3, 4]
    assert REQUIRED_DATA_KEYS["train"] <= trains[0].keys()
    assert "held_out_exact_match" in trains[1] and "filtered_rate" in trains[0]
    # Every step's distributions cover exactly the samples it trained on (8 prompts x 4), on the run's edges.
    for d in trains:
        assert sorted(d["histograms"]) == sorted(HISTOGRAM_KEYS)
        assert {sum(h["counts"]) for h in d["histograms"].values()} == {8 * 4}
        assert d["histograms"]["staleness"]["edges"] == [-0.5, 0.5]  # max_staleness 0: one bucket
    assert [e["data"]["version"] for e in events if e["type"] == "version"] == [1, 2, 3, 4]
    # Capture (defaults: 2 drawn groups plus the best and the worst, whole groups of 4): after each train event.
    samples = [e["data"] for e in events if e["type"] == "sample"]
    for step in (1, 2, 3, 4):
        mine = [s for s in samples if s["step"] == step]
        groups = {s["group"] for s in mine}
        # 4 groups; 3 when every group of the step has the same mean reward (then best is also worst).
        assert len(groups) in (3, 4) and len(mine) == 4 * len(groups)
        assert {"best", "sampled"} <= {s["pick"] for s in mine} <= {"best", "worst", "sampled"}
        assert groups <= set(trains[step - 1]["group_ids"])  # groups that step trained on
    assert (ckpt / "latest").read_text() == "step-000004"
    meta = json.loads((ckpt / "step-000004" / "meta.json").read_text())
    assert meta["version"] == 4 and meta["config"]["steps"] == 4

    eval_events = tmp_path / "eval.jsonl"
    proc = trainer_cli("eval", "--checkpoint", str(ckpt), "--events", str(eval_events))
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert metrics["version"] == 4 and 0.0 <= metrics["held_out_exact_match"] <= 1.0
    final = read_events(eval_events)[-1]
    assert final["type"] == "status" and final["data"]["status"] == "succeeded"
    assert final["data"]["metrics"]["held_out_exact_match"] == metrics["held_out_exact_match"]


def test_invalid_config_exits_2_with_a_message_naming_the_field(tmp_path: Path) -> None:
    events_path = tmp_path / "events.jsonl"
    proc = trainer_cli("run", "--config", str(write_config(tmp_path, group_size=True)), "--events", str(events_path))
    assert proc.returncode == 2
    assert "group_size: expected an integer, got True" in proc.stderr
    (event,) = read_events(events_path)
    assert event["type"] == "status" and event["data"]["status"] == "failed"
    assert "group_size" in event["data"]["error"]


def test_sigterm_checkpoints_emits_a_final_status_and_resume_continues(tmp_path: Path) -> None:
    events_path, ckpt = tmp_path / "events.jsonl", tmp_path / "ckpt"
    config = write_config(tmp_path, steps=400, checkpoint_every=0, eval_every=0)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer",
            "run",
            "--config",
            str(config),
            "--events",
            str(events_path),
            "--checkpoint-dir",
            str(ckpt),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(
        lambda: (
            proc.poll() is not None
            or events_path.exists()
            and sum(e["type"] == "train" for e in read_events(events_path)) >= 2
        ),
        timeout=90,
        what="two train events",
        interval=0.1,
    )
    assert proc.poll() is None, proc.stderr.read()[-2000:]  # stopped mid-run, not after the end
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    events = read_events(events_path)
    assert [e["data"]["status"] for e in events if e["type"] == "status"] == ["running", "stopping", "cancelled"]
    stopped_at = events[-1]["data"]["version"]
    assert 2 <= stopped_at < 400
    ckpt_event = [e["data"] for e in events if e["type"] == "checkpoint"][-1]
    assert ckpt_event["reason"] == "stop" and ckpt_event["version"] == stopped_at
    consumed = [gid for e in events if e["type"] == "train" for gid in e["data"]["group_ids"]]

    write_config(tmp_path, steps=stopped_at + 2, checkpoint_every=0, eval_every=0)
    proc2 = trainer_cli(
        "run", "--config", str(config), "--events", str(events_path), "--checkpoint-dir", str(ckpt), "--resume"
    )
    assert proc2.returncode == 0, proc2.stderr[-2000:]
    resumed = read_events(events_path)[len(events) :]
    assert resumed[0]["seq"] == events[-1]["seq"] + 1  # the appended stream stays strictly increasing
    versions = [e["data"]["version"] for e in resumed if e["type"] == "version"]
    assert versions == [stopped_at, stopped_at + 1, stopped_at + 2]  # restore publishes, then continues
    more = [gid for e in resumed if e["type"] == "train" for gid in e["data"]["group_ids"]]
    assert not set(more) & set(consumed)  # nothing trained twice; groups in flight at the stop come back


def caught_signals(pid: int) -> int:
    """The signals the process has handlers for (the SigCgt mask of /proc/<pid>/status), 0 once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)


def test_a_stop_while_the_job_still_imports_cancels_it_before_it_trains(tmp_path: Path) -> None:
    """Ray stops a job with SIGINT: one that comes while `run` still imports torch (a second or more) is kept
    and ends the run before it starts, with its final status; it used to raise KeyboardInterrupt mid-import."""
    events_path = tmp_path / "events.jsonl"
    config = write_config(tmp_path, steps=400, checkpoint_every=0, eval_every=0)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "trainer", "run", "--config", str(config), "--events", str(events_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Python catches SIGINT from its start, SIGTERM only once `run` installed its handlers (its first line).
    wait_until(
        lambda: proc.poll() is not None or caught_signals(proc.pid) & (1 << (signal.SIGTERM - 1)),
        timeout=30,
        what="the handlers",
        interval=0.005,
    )
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    assert "KeyboardInterrupt" not in err
    events = read_events(events_path)
    assert [e["data"]["status"] for e in events if e["type"] == "status"] == ["stopping", "cancelled"]
    assert not [e for e in events if e["type"] in ("train", "resources", "worker")]  # nothing started
    assert json.loads(out.strip().splitlines()[-1])["status"] == "cancelled"


def test_debug_phases_rollout_only_then_train_only(tmp_path: Path) -> None:
    from trainer.config import TrainConfig
    from trainer.loop import TrainingRun
    from trainer.sinks import EventEmitter, JsonlSink

    batch = tmp_path / "batch.pt"
    cfg = TrainConfig.from_dict({**LOCAL, "phase": "rollout_only", "batch_path": str(batch)})
    assert TrainingRun(cfg).run().status == "succeeded"
    assert batch.exists()
    events_path = tmp_path / "train.jsonl"
    emitter = EventEmitter([JsonlSink(events_path)])
    result = TrainingRun(cfg.replace(phase="train_only"), emitter=emitter).run()
    emitter.close()
    assert result.status == "succeeded" and result.version == 1
    trains = [e["data"] for e in read_events(events_path) if e["type"] == "train"]
    assert len(trains) == 1 and trains[0]["step"] == 1 and trains[0]["groups"] == 8
