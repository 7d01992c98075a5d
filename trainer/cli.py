"""`python -m trainer run|eval`: the job entrypoint the platform launches on Ray (and people run by hand).

Exit codes: 0 succeeded, 1 failed (the last status event carries the error), 2 invalid config or arguments,
143 stopped on request (SIGTERM from `ray job stop`, or the platform answered 409): final status `cancelled`.
0 too, without training and without a final status event, when the run's placement group was not ready within
`placement_timeout_s`: the last event is `resources` `timeout` and the platform puts the run back in its queue
(stdout: `{"status": "placement_timeout", ...}`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config import ConfigError, TrainConfig
from trainer.sinks import EventEmitter, sink_for

if TYPE_CHECKING:
    from trainer.loop import TrainingRun

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED = 0, 1, 2, 143


def config_load(path: str, *, allow_debug: bool = True) -> TrainConfig:
    """A JSON or YAML file holding (a subset of) TrainConfig's keys (`allow_debug=False`: no debug phase, no
    batch_path, as the platform requires)."""
    text = Path(path).read_text()
    if path.endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(text) or {}
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("config", f"{path} is not valid JSON ({exc})") from None
    return TrainConfig.from_dict(data, allow_debug=allow_debug)


class ProgressSink:
    """A tqdm bar over training steps, shown only on a terminal."""

    stop_requested = False

    def __init__(self, total: int) -> None:
        import shutil

        from tqdm import tqdm

        # A pseudo-terminal may report 0 columns, with which tqdm draws nothing.
        self.bar = tqdm(total=total, unit="step", ncols=shutil.get_terminal_size((100, 20)).columns)

    def write(self, event: dict[str, Any]) -> None:
        if event["type"] == "train":
            d = event["data"]
            self.bar.n = d["step"]
            post = {"reward": f"{d['reward_mean']:.3f}", "em": f"{d['exact_match']:.3f}"}
            if "train_exact_match" in d:
                post["greedy_em"] = f"{d['train_exact_match']:.3f}"
                post["held_out"] = f"{d['held_out_exact_match']:.3f}"
            self.bar.set_postfix(post, refresh=True)

    def close(self, timeout_s: float = 0.0) -> None:
        self.bar.close()


def _emitter(target: str | None, progress_total: int | None = None) -> EventEmitter:
    sinks: list[Any] = sink_for(target)
    if progress_total is not None and sys.stderr.isatty():
        sinks.append(ProgressSink(progress_total))
    return EventEmitter(sinks, run=os.environ.get("RUN_ID") or None)


class EarlyStop:
    """SIGTERM and SIGINT from the first line of `run` on: a stop that arrives while the job still imports torch
    and Ray (seconds) is kept and handed to the run once it exists. Left to Python, such a SIGINT raised
    KeyboardInterrupt inside whatever import was running (a traceback, no final status)."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.run: TrainingRun | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)

    def on_signal(self, signum: int, frame: Any) -> None:
        reason = f"received {signal.Signals(signum).name}"
        if self.run is None:
            self.reason = self.reason or reason
        else:
            self.run.request_stop(reason)

    def attach(self, run: TrainingRun) -> None:
        """From now on a signal goes to `run`; one that came before is handed over now."""
        self.run = run
        if self.reason is not None:
            run.request_stop(self.reason)


def cmd_run(args: argparse.Namespace) -> int:
    stop = EarlyStop()
    stop.install()
    try:
        cfg = config_load(args.config, allow_debug=not args.sandboxed)
    except (ConfigError, OSError) as exc:
        emitter = _emitter(args.events)
        emitter.emit("status", {"status": "failed", "error": f"invalid config: {exc}"})
        emitter.close()
        print(f"invalid config: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.resume and not args.checkpoint_dir:
        print("--resume needs --checkpoint-dir", file=sys.stderr)
        return EXIT_USAGE
    # The sink heartbeats from now on (an HTTP sink posts every few seconds), before torch is even imported.
    emitter = _emitter(args.events, cfg.steps)
    # The driver computes with its bundle's threads; set before torch is first imported (trainer.loop does).
    from trainer.resources import run_bundles

    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(run_bundles(cfg)[0].threads)
    from trainer.loop import PLACEMENT_TIMEOUT, TrainingRun

    run = TrainingRun(cfg, emitter=emitter, checkpoint_dir=args.checkpoint_dir, resume=args.resume)
    stop.attach(run)
    try:
        result = run.run()
    except Exception as exc:  # noqa: BLE001 - reported as the run's final status
        traceback.print_exc()
        emitter.emit("status", {"status": "failed", "version": run.version, "error": f"{type(exc).__name__}: {exc}"})
        emitter.close()
        return EXIT_FAILED
    emitter.close()
    print(
        json.dumps(
            {
                "status": result.status,
                "version": result.version,
                "checkpoint": result.checkpoint,
                "metrics": {k: v for k, v in result.metrics.items() if not isinstance(v, list)},
            }
        )
    )
    return EXIT_OK if result.status in ("succeeded", PLACEMENT_TIMEOUT) else EXIT_STOPPED


def cmd_eval(args: argparse.Namespace) -> int:
    from trainer.checkpoint import checkpoint_load
    from trainer.evaluate import eval_prompts, evaluate
    from trainer.learner import Learner
    from trainer.problems import task_build

    emitter = _emitter(args.events)
    try:
        emitter.emit("status", {"status": "running"})
        meta, state = checkpoint_load(args.checkpoint)
        cfg = TrainConfig.from_dict(meta["config"]).replace(device="cpu")
        learner = Learner(cfg)
        learner.model.load_state_dict(state["trainer"]["model"])
        task = task_build(cfg)
        n = args.prompts or max(len(task.train_prompts), len(task.held_out_prompts))
        train = evaluate(learner.model, task, eval_prompts(task.train_prompts, n))
        held = evaluate(learner.model, task, eval_prompts(task.held_out_prompts, n))
        metrics = {
            "checkpoint_step": meta["step"],
            "version": meta["version"],
            "task": cfg.task,
            "train_exact_match": train["exact_match"],
            "train_reward": train["reward"],
            "held_out_exact_match": held["exact_match"],
            "held_out_reward": held["reward"],
        }
        emitter.emit("log", {"level": "info", "message": "evaluation finished", "eval": metrics})
        emitter.emit("status", {"status": "succeeded", "metrics": metrics})
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        emitter.emit("status", {"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
        emitter.close()
        return EXIT_FAILED
    emitter.close()
    print(json.dumps(metrics))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="RL training job (GRPO on Ray)")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train a policy")
    run.add_argument("--config", required=True, help="JSON or YAML file with TrainConfig keys")
    run.add_argument("--events", help="JSONL path, or http(s) URL of the platform's ingest endpoint")
    run.add_argument("--checkpoint-dir", help="where checkpoints go (and come from with --resume)")
    run.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the dir")
    run.add_argument(
        "--sandboxed",
        action="store_true",
        help="refuse the debug phases and batch_path, as the platform does (it launches jobs with it)",
    )
    run.set_defaults(fn=cmd_run)
    ev = sub.add_parser("eval", help="held-out metrics of a checkpoint")
    ev.add_argument("--checkpoint", required=True, help="checkpoint dir (a run's dir or one step-* in it)")
    ev.add_argument("--events", help="JSONL path, or http(s) URL of the platform's ingest endpoint")
    ev.add_argument("--prompts", type=int, default=0, help="prompts per split (default: all)")
    ev.set_defaults(fn=cmd_eval)
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.fn
    return command(args)
