"""Evaluation of a one-turn environment on the learner's weights (trainer/agent_episodes.py `evaluate_one_turn`):
its greedy replies are the ones the engine gives the same requests (the same weights, logit_bias, stop at
`<|end|>`), batched by shape; the environment's `score_reply` scores them; a request that does not fit the
context is refused; a multi-turn environment has no one turn (it is evaluated through the session server)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agents.chat import STOP, decode, render
from agents.envs.digits import DIGIT_BIAS, DigitsEnvironment
from agents.envs.tools import ToolsEnvironment
from trainer.agent_episodes import evaluate_one_turn
from trainer.config import TrainConfig
from trainer.engine import Engine
from trainer.evaluate import greedy_replies
from trainer.policy import build_policy
from trainer.problems import policy_shape

torch.set_num_threads(1)
CFG = TrainConfig(
    environment="digits", context_tokens=16, d_model=32, n_head=4, n_layer=1, group_size=2, mode="local", device="cpu"
)
PAIRS = sorted((int(k), float(v)) for k, v in DIGIT_BIAS.items())


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_policy(CFG, *policy_shape(CFG)).eval()


async def _engine_replies(model: torch.nn.Module, requests: list[tuple[list[int], int, list]]) -> list[list[int]]:
    engine = Engine(CFG, "e0", max_sessions=64)
    engine.seal()
    await engine.drain(5)
    await engine.install_version(1, model.state_dict())
    engine.reopen()
    outs = [
        await engine.generate(f"s{k}", [p], n, k, f"s{k}/0", greedy=True, last=True, stop=[STOP], logit_bias=bias)
        for k, (p, n, bias) in enumerate(requests)
    ]
    return [[t for t in out["tokens"][0] if t != STOP] for out in outs]  # the server strips the stop token


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_learner_greedy_replies_are_the_engines(seed: int) -> None:
    env = DigitsEnvironment(seed=0)
    tasks = env.tasks("held_out")[:12]
    requests = [(render(list(t.messages)), env.max_tokens, PAIRS if k % 2 else []) for k, t in enumerate(tasks)]
    requests.append((render([{"role": "user", "content": "12"}]), 8, []))  # long enough to stop at <|end|>, maybe
    model = _model(seed)
    mine = greedy_replies(model, requests, STOP, CFG.temperature)
    assert mine == asyncio.run(_engine_replies(model, requests))
    assert all(set(decode(ids)) <= set("0123456789") for ids, (_, _, b) in zip(mine, requests) if b)
    assert len({len(r[0]) for r in requests}) > 1  # prompts of several lengths: several batches


def test_evaluate_one_turn_scores_with_the_environment() -> None:
    env = DigitsEnvironment(seed=0)
    tasks = env.tasks("train")[:10]
    turns = [env.one_turn(t) for t in tasks]
    seen: list = []

    def replies_of(requests: list) -> list[list[int]]:
        seen.extend(requests)
        # right for the first 4 tasks, a wrong first digit for the rest
        return [
            render([{"role": "user", "content": t.answer if k < 4 else "x" + t.answer[1:]}])[1:-2]
            for k, t in enumerate(tasks)
        ]

    got = evaluate_one_turn(env, tasks, turns, replies_of)
    assert got == {"exact_match": pytest.approx(0.4), "reward": pytest.approx(0.4)}
    assert seen[0] == (render(list(tasks[0].messages)), env.max_tokens, PAIRS)


def test_a_request_over_the_context_is_refused() -> None:
    model = _model(0)
    model.train()
    with pytest.raises(ValueError, match="request 1"):
        greedy_replies(model, [([1, 20], 3, []), ([1] * 14, 4, [])], STOP, 1.0)
    assert model.training  # refused before the learner's model was switched to eval mode


def test_a_multi_turn_environment_has_no_one_turn() -> None:
    tools = ToolsEnvironment(seed=0)
    assert tools.one_turn(tools.tasks("train")[0]) is None
    with pytest.raises(NotImplementedError):
        tools.score_reply(tools.tasks("train")[0], "1")


def test_the_loop_evaluates_a_one_turn_environment_on_the_learner_and_others_through_the_server() -> None:
    """`step_report._evaluate` asks the learner (`greedy_replies`) for digits, and runs episodes through the
    session server (the run's loop) for a multi-turn environment."""
    from types import SimpleNamespace

    from trainer import step_report

    calls: list[str] = []

    class Runtime:
        serving = object()

        def trainer_call(self, method: str, requests: list, stop: int) -> list[list[int]]:
            calls.append(method)
            assert stop == STOP and all(n == 3 for _, n, _ in requests)
            return [[] for _ in requests]

        class loop:  # noqa: N801 - stands for the run's event loop
            @staticmethod
            def run(coro):
                coro.close()
                calls.append("server")
                return {"exact_match": 0.25, "reward": 0.5}

    def run_with(env) -> dict:
        run = SimpleNamespace(cfg=SimpleNamespace(eval_prompts=8), env=env, rt=Runtime(), version=3)
        return step_report._evaluate(run)

    got = run_with(DigitsEnvironment(seed=0))
    assert calls == ["greedy_replies", "greedy_replies"]  # training and held-out tasks
    assert got == {"train_exact_match": 0.0, "train_reward": 0.0, "held_out_exact_match": 0.0, "held_out_reward": 0.0}
    calls.clear()
    got = run_with(ToolsEnvironment(seed=0))
    assert calls == ["server", "server"] and got["train_exact_match"] == 0.25
