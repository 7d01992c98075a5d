"""Step 4 of the loop, reporting a trained step: the `train` event (with an evaluation when one is due), the
captured `sample` events, the sampler's progress and, for an agent environment, the `agents` event.

`TrainingRun.report` is `report` here. The data of each event is built by `trainer.reports` (pure functions);
these functions gather it from the run and emit it. They use only the public members of the run (tested).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from agents.chat import STOP
from trainer import reports
from trainer.agent_episodes import evaluate_env, evaluate_one_turn, spread
from trainer.episodes import Group
from trainer.samples import samples_capture

if TYPE_CHECKING:
    from trainer.loop import TrainingRun


def report(run: TrainingRun, groups: list[Group], stats: dict[str, Any], elapsed: float) -> None:
    """The train event (with an evaluation when due), captured samples, the sampler's progress and, for an agent
    environment, the agents event. `elapsed`: seconds since the run's steps began."""
    cfg = run.cfg
    data = reports.train_data(
        run.version,
        stats,
        groups,
        filtered_rate=run.metrics.get("filtered_rate", 0.0),
        elapsed=elapsed,
        samples=run.samples,
        gate_closed_s=run.gate_closed_s,
        edges=run.histogram_edges,
        steps_total=cfg.steps,
    )
    if cfg.eval_every and (run.version % cfg.eval_every == 0 or run.version == cfg.steps):
        started_at = time.time()
        data.update(_evaluate(run))
        data["eval_span"] = reports.span(started_at, time.time())
    run.metrics.update({k: v for k, v in data.items() if k not in reports.NOT_METRICS})
    run.emit("train", data)
    for sample in samples_capture(groups, task=run.task, step=run.version, cfg=cfg):
        run.emit("sample", dict(sample))
    run.emit("sampler", run.sampler.progress())
    if run.env is not None and run.rt.servers:
        emit_agents(run, groups)


def emit_agents(run: TrainingRun, groups: list[Group]) -> None:
    """The agents event: one stats call per session server and per worker (trainer/reports.py)."""
    servers, workers = run.rt.servers_call("stats"), run.rt.workers_call("stats")
    run.emit("agents", reports.agents_data(run.version, servers, workers, groups))


def _evaluate(run: TrainingRun) -> dict[str, float]:
    """Greedy exact-match and reward on training and held-out tasks: by the learner on its own weights, or for
    an agent environment, episodes through the session server at the version just published (a one-turn
    environment's one request is asked of the learner's weights, the same version: `evaluate_one_turn`)."""
    n = run.cfg.eval_prompts
    if run.env is None or run.rt.serving is None:
        result: dict[str, float] = run.rt.trainer_call("evaluate", n)
        return result
    out: dict[str, float] = {}
    for split in ("train", "held_out"):
        tasks = spread(run.env.tasks(split), n)
        turns = [turn for t in tasks if (turn := run.env.one_turn(t)) is not None]
        if tasks and len(turns) == len(tasks):
            got = evaluate_one_turn(run.env, tasks, turns, lambda r: run.rt.trainer_call("greedy_replies", r, STOP))
        else:
            got = run.rt.loop.run(evaluate_env(run.env, run.rt.serving, tasks, f"eval:v{run.version}:{split}"))
        out[f"{split}_exact_match"], out[f"{split}_reward"] = got["exact_match"], got["reward"]
    return out
