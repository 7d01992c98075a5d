"""Environments' pure parts (task sets, tool-call parsing, the calc tool's refusals, the registry) and the code
tool on the real sandbox. Episodes against a live session server: tests/agents/test_live_run.py."""

import asyncio

import pytest

from agents.environments import BUILTIN, Environment, UnknownEnvironment, available, resolve
from agents.envs.code import run_code, snippet_of
from agents.envs.digits import DigitsEnvironment, prefix_score
from agents.envs.tools import ToolError, ToolsEnvironment, calc, parse_call, run_tool
from trainer.config import TrainConfig
from trainer.problems import task_build


def test_digits_tasks_are_the_trainers_prompts_and_split():
    env, task = DigitsEnvironment(seed=0), task_build(TrainConfig())
    train = [(t.meta["a"], t.meta["d"], t.messages[0]["content"], t.answer) for t in env.tasks("train")]
    want = [
        (p.start, p.diff, "".join(str(p.term(k, 10)) for k in range(p.shown)), task.answer_text(p))
        for p in task.train_prompts
    ]
    assert sorted(train) == sorted(want)
    held = {(t.meta["a"], t.meta["d"]) for t in env.tasks("held_out")}
    assert held == {(p.start, p.diff) for p in task.held_out_prompts}
    assert not held & {(t.meta["a"], t.meta["d"]) for t in env.tasks("train")}


def test_prefix_score_gives_partial_credit_up_to_the_first_wrong_character():
    assert prefix_score("135", "135") == (1.0, 1.0)
    assert prefix_score("135", "195") == (1 / 3, 0.0)
    assert prefix_score("135", "1350") == (1.0, 0.0)  # right prefix, extra text: not exact
    assert prefix_score("135", "") == (0.0, 0.0)


@pytest.mark.parametrize(
    "reply, call",
    [("calc(7*8+3)", ("calc", "7*8+3")), (" lookup(pear) ", ("lookup", "pear")), ("calc()", None),
     ("shell(ls)", None), ("calc(1+1) and more", None), ("59", None)],
)  # fmt: skip
def test_tool_calls_parse_only_in_the_documented_format(reply, call):
    assert parse_call(reply) == call


@pytest.mark.parametrize(
    "expression", ["__import__('os').system('id')", "2**100", "9" * 65, "(1).real", "[1]*9", "10**9*10", "1/0"]
)
def test_calc_refuses_anything_but_bounded_integer_arithmetic(expression):
    with pytest.raises(ToolError):
        calc(expression)


def test_tools_answer_or_report_an_error():
    assert calc("7*8+3") == 59 and calc("-(2-5)*3") == 9
    assert run_tool("calc", "7*8+3") == ("59", True)
    assert run_tool("lookup", "pear") == ("7", True)
    content, ok = run_tool("lookup", "gold")
    assert not ok and content.startswith("error: no price")


def test_tool_tasks_are_fixed_by_the_seed_and_need_the_tool():
    a, b = ToolsEnvironment(seed=3), ToolsEnvironment(seed=3)
    assert a.tasks("train") == b.tasks("train") and a.tasks("train") != ToolsEnvironment(seed=4).tasks("train")
    for task in a.tasks("held_out")[:50]:
        name = task.meta["tool"]
        argument = task.messages[0]["content"].removeprefix("price ")
        assert run_tool(name, argument) == (task.answer, True)


def test_registry_resolves_builtins_and_only_allowed_paths():
    for name in BUILTIN:
        assert issubclass(resolve(name), Environment)
    assert set(BUILTIN) <= set(available())
    with pytest.raises(UnknownEnvironment, match="unknown"):
        resolve("chess")
    with pytest.raises(UnknownEnvironment, match="allowed"):
        resolve("agents.envs.digits:DigitsEnvironment")  # a real class, but staff did not allow the path
    assert resolve("agents.envs.digits:DigitsEnvironment", allowed=["agents.envs.digits:DigitsEnvironment"])
    with pytest.raises(UnknownEnvironment, match="not an agents.environments.Environment"):
        resolve("os:getcwd", allowed=["os:getcwd"])
    with pytest.raises(UnknownEnvironment, match="module:Class"):
        resolve("../x:y", allowed=["../x:y"])
    with pytest.raises(UnknownEnvironment):
        resolve("")


def test_code_tool_runs_snippets_in_the_sandbox_and_reports_errors():
    assert snippet_of("run:print(7*8+3)") == "print(7*8+3)" and snippet_of("59") is None and snippet_of("run:") is None
    assert asyncio.run(run_code("print(7*8+3)")) == ("59", True)
    content, ok = asyncio.run(run_code("import socket; socket.create_connection(('127.0.0.1', 22), 1)"))
    assert not ok and content.startswith("error:")
    content, ok = asyncio.run(run_code("x = 1"))
    assert (content, ok) == ("error: the snippet printed nothing", False)
