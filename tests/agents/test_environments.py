"""Environments' pure parts (task sets, tool-call parsing, the calc tool's refusals, the registry, the rewards of
an episode whose replies are scripted) and the code tool on the real sandbox. Episodes against a live session
server: tests/agents/test_server_ray.py and the learning bench (bench/agents_learning.py)."""

import asyncio

import pytest

from agents.chat import render
from agents.environments import BUILTIN, Environment, UnknownEnvironment, available, resolve
from agents.envs.code import run_code, snippet_of
from agents.envs.digits import DigitsEnvironment, prefix_score
from agents.envs.tools import (
    MAX_TOOL_REPLY,
    REWARD_WEIGHTS,
    ToolError,
    ToolsEnvironment,
    calc,
    call_shape,
    parse_call,
    run_tool,
)
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


class Scripted:
    """An openai client stand-in for a pure test of an environment's scoring: answers each chat turn with the next
    scripted reply and keeps what it was asked (the episode's HTTP path is tested on real Ray elsewhere)."""

    def __init__(self, *replies: str) -> None:
        self.replies, self.asked = list(replies), []
        self.chat = self.completions = self

    async def create(self, **kwargs):
        self.asked.append(kwargs)
        content = self.replies.pop(0)
        choice = type("C", (), {"index": 0, "message": type("M", (), {"content": content})})  # as openai's Choice
        return type("R", (), {"choices": [choice]})

    async def post(self, path, *, cast_to, body):  # the call agents.environments.chat_completion makes
        assert (path, cast_to) == ("/chat/completions", object)
        self.asked.append(body)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": self.replies.pop(0)}}]}


def _episode(env, task, *replies):
    client = Scripted(*replies)
    return asyncio.run(env.run_episode(client, "s", task)), client.asked


def test_digits_asks_for_exactly_the_answer_and_scores_it_like_the_in_process_task():
    """The reply is the answer's length, as DigitTask generates it: all three terms right is exact without any
    `<|end|>` after them (asking for one more token made exact-match depend on a stop no reward paid for)."""
    env, task = DigitsEnvironment(seed=0), task_build(TrainConfig())
    assert env.max_tokens == task.turn_len() == 3
    t = env.tasks("train")[0]
    result, asked = _episode(env, t, t.answer)
    assert asked[0]["max_tokens"] == 3 and (result.reward, result.exact) == (1.0, 1.0)
    assert result.parts == {"term_1": 1.0, "term_2": 1.0, "term_3": 1.0}
    wrong_last = t.answer[:2] + str((int(t.answer[2]) + 1) % 10)
    result, _ = _episode(env, t, wrong_last)
    assert (result.reward, result.exact) == (2 / 3, 0.0)
    assert (result.reward, result.exact) == task.score(task.train_prompts[0], [int(c) for c in wrong_last])


def test_a_group_request_carries_the_seed_it_is_given_and_none_without_one():
    env = DigitsEnvironment(seed=0)
    t = env.tasks("train")[0]
    for seed, want in ((123, {"seed": 123}), (None, {})):
        client = Scripted(t.answer)
        client.post = _n_choices(client, 2)
        asyncio.run(env.run_group(client, "s", t, 2, seed=seed))
        assert {k: v for k, v in client.asked[0].items() if k == "seed"} == want and client.asked[0]["n"] == 2


def _n_choices(client, n):
    async def post(path, *, cast_to, body):
        client.asked.append(body)
        reply = client.replies[0]
        return {"choices": [{"index": k, "message": {"role": "assistant", "content": reply}} for k in range(n)]}

    return post


@pytest.mark.parametrize(
    "reply, shape",
    [("calc:7*8+3", 1.0), (" lookup:pear ", 1.0), ("c:1", 1.0), ("l:pear", 1.0), ("looku:x", 1.0),
     ("calc:", 1.0), ("c:", 1.0),  # both fixed parts, no argument: shaped, not a call
     ("c", 0.5), ("calc", 0.5), ("lo", 0.5), ("cx:1", 0.5), ("lookupx:1", 0.5), ("calc(7*8+3)", 0.5),
     ("", 0.0), ("59", 0.0), ("x:1", 0.0), ("xcalc:1", 0.0), (":1", 0.0), ("a c:", 0.0), ("C:1", 0.0)],
)  # fmt: skip
def test_call_shape_counts_a_calls_two_fixed_parts_in_place(reply, shape):
    """A tool's name or a prefix of it at the start is half, `:` right after it the other half; elsewhere in the
    reply they count for nothing."""
    assert call_shape(reply) == shape


def test_tools_reward_is_the_answer_a_valid_call_and_the_calls_shape():
    env = ToolsEnvironment(seed=0)
    calc_task = next(t for t in env.tasks("train") if t.meta["tool"] == "calc")
    assert sum(REWARD_WEIGHTS.values()) == pytest.approx(1.0)
    call = f"calc:{calc_task.messages[0]['content']}"
    result, asked = _episode(env, calc_task, call, calc_task.answer)
    assert result.parts == {"answer": 1.0, "valid_call": 1.0, "call_shape": 1.0} and result.reward == 1.0
    assert (result.exact, result.turns, result.tool_calls, result.valid_tool_calls, result.tool_errors) == (
        1.0, 2, 1, 1, 0,
    )  # fmt: skip
    assert asked[1]["messages"][-1] == {"role": "tool", "content": calc_task.answer, "tool_call_id": "call_0"}
    result, _ = _episode(env, calc_task, call, "0")  # a valid call, a wrong answer
    assert result.parts == {"answer": 0.0, "valid_call": 1.0, "call_shape": 1.0}
    assert result.reward == pytest.approx(0.3) and result.exact == 0.0
    result, _ = _episode(env, calc_task, "calc")  # half the shape of a call, not a call: it is the final answer
    assert result.parts == {"answer": 0.0, "valid_call": 0.0, "call_shape": 0.5}
    assert result.reward == pytest.approx(0.1 * 0.5) and (result.turns, result.tool_calls) == (1, 0)
    result, _ = _episode(env, calc_task, "c:", "0")  # the whole shape, no argument: a call, not a valid one
    assert result.parts == {"answer": 0.0, "valid_call": 0.0, "call_shape": 1.0}
    assert (result.turns, result.tool_calls, result.valid_tool_calls) == (1, 1, 0)
    result, asked = _episode(env, calc_task, f"c:{calc_task.messages[0]['content']}", calc_task.answer)  # a prefix
    assert result.reward == 1.0 and asked[1]["messages"][-1]["content"] == calc_task.answer
    result, _ = _episode(env, calc_task, calc_task.answer)  # guessed right without the tool: still the answer
    assert result.reward == pytest.approx(0.7) and result.parts["valid_call"] == 0.0
    result, _ = _episode(env, calc_task, "shell:ls")  # a call of an unknown tool: counted, not valid
    assert (result.tool_calls, result.valid_tool_calls, result.parts["valid_call"]) == (1, 0, 0.0)
    result, _ = _episode(env, calc_task, "calc:abc", "0")  # valid format, the tool cannot answer it
    assert (result.valid_tool_calls, result.tool_errors, result.parts["valid_call"]) == (1, 1, 1.0)


def test_prefix_score_gives_partial_credit_up_to_the_first_wrong_character():
    assert prefix_score("135", "135") == (1.0, 1.0)
    assert prefix_score("135", "195") == (1 / 3, 0.0)
    assert prefix_score("135", "1350") == (1.0, 0.0)  # right prefix, extra text: not exact
    assert prefix_score("135", "") == (0.0, 0.0)


@pytest.mark.parametrize(
    "reply, call",
    [("calc:7*8+3", ("calc", "7*8+3")), (" lookup: pear ", ("lookup", "pear")), ("c:7*8+3", ("calc", "7*8+3")),
     ("cal:1", ("calc", "1")), ("l:pear", ("lookup", "pear")), ("looku:fig", ("lookup", "fig")),
     ("calc:1+1 and more", ("calc", "1+1 and more")),  # the argument is the rest of the reply
     ("calc:", None), ("calc:   ", None), ("calc:" + "1" * 65, None),  # no argument, or one over 64 characters
     ("shell:ls", None), ("cx:1", None), ("lookupx:1", None), ("x:1", None),  # not a tool's name or a prefix of one
     ("calc(7*8+3)", None), ("calc 7*8+3", None), ("Calc:1", None), ("59", None), ("", None)],
)  # fmt: skip
def test_tool_calls_parse_only_in_the_documented_format(reply, call):
    assert parse_call(reply) == call


@pytest.mark.parametrize(
    "expression", ["__import__('os').system('id')", "2**100", "9" * 65, "(1).real", "[1]*9", "10**9*10", "1/0"]
)
def test_calc_refuses_anything_but_bounded_integer_arithmetic(expression):
    with pytest.raises(ToolError):
        calc(expression)


@pytest.mark.parametrize(
    "name, argument",
    [("calc", "(1]"), ("calc", '"abc'), ("calc", "1+"), ("lookup", "\\" * 20), ("lookup", "x" * 64)],
)
def test_a_tool_error_is_cut_so_the_episode_fits_its_context(name, argument):
    """The longest first exchange (a 20-token reply, the longest error) still leaves the final answer its 20
    tokens in the bench's 128-token context."""
    content, ok = run_tool(name, argument)
    assert not ok and content.startswith("error: ") and len(content) <= MAX_TOOL_REPLY
    env, longest_question = ToolsEnvironment(seed=0), "price apple"
    assert max(len(t.messages[0]["content"]) for t in env.tasks("train")) <= len(longest_question)
    opening = render([{"role": "user", "content": longest_question}])
    first_reply = env.max_tokens + 1  # its <|end|>, sampled or fed
    tool = render([{"role": "tool", "content": "e" * MAX_TOOL_REPLY}])
    assert len(opening) + first_reply + len(tool) + env.max_tokens <= 128


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
