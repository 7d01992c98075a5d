"""`tools`: a multi-turn agent that must call a tool to answer.

Each task is a question the policy cannot answer from the text alone: an arithmetic expression (`"7*8+3"`,
tool `calc`) or the price of an item in a table it never sees (`"price pear"`, tool `lookup`). The documented
text format of a tool call is the whole reply `name:argument`, the name a tool's name or a prefix of it, the
argument the rest of the reply: `calc:7*8+3`, `c:7*8+3`, `lookup:pear`, `l:pear` (the `code` environment's
`run:<python>` is the same shape). The environment runs the tool, sends its result back as a `tool` message, and
the policy's next reply is its final answer (just the number). Replies that are not a tool call end the episode
as the final answer.

Reward (shaped, its parts are the episode's `parts`): 0.7 x `answer` (the final answer is right) + 0.2 x
`valid_call` (the first reply is a call of a known tool in the documented format) + 0.1 x `call_shape` (the share
of a call's two fixed parts, a tool's name or prefix at the reply's start and `:` right after it, that the first
reply has). Only the answer is the task; the other two parts make the way to it learnable (docs/agents.md,
"tools", says why the format is this short). exact = the final answer is right. Counted per episode: tool calls,
valid ones, tool errors (a valid call the tool could not answer)."""

from __future__ import annotations

import ast
import operator
import random
import re
from typing import Any

from agents.environments import Environment, EpisodeResult, Split, Task, chat

CALL = re.compile(r"^\s*([a-z]{1,16}):(.*)$", re.S)  # a name, `:`, then the rest of the reply: the argument
PRICES = {
    "apple": 12, "pear": 7, "plum": 31, "fig": 5, "kiwi": 18, "lime": 9, "date": 44, "nut": 3,
    "corn": 26, "bean": 14, "rice": 38, "salt": 2, "milk": 21, "egg": 6, "tea": 15, "jam": 27,
}  # fmt: skip
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
LIMIT = 10**9


class ToolError(ValueError):
    pass


def calc(expression: str) -> int:
    """Integer +, -, * and parentheses only, by walking the syntax tree (never eval); bounded values."""
    if len(expression) > 64:
        raise ToolError("expression longer than 64 characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"not an expression: {exc.msg}") from None

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            value = node.value
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            value = -walk(node.operand)
        elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            value = _OPS[type(node.op)](walk(node.left), walk(node.right))
        else:
            raise ToolError(f"unsupported: {type(node).__name__}")
        if abs(value) > LIMIT:
            raise ToolError("value out of range")
        return value

    return walk(tree)


def lookup(item: str) -> int:
    try:
        return PRICES[item.strip()]
    except KeyError:
        raise ToolError(f"no price for {item.strip()[:32]!r}") from None


TOOLS = {"calc": calc, "lookup": lookup}


def tool_named(name: str) -> str | None:
    """The tool `name` calls: a tool's whole name or a prefix of it (`c`, `ca`, `cal` and `calc` are calc), as a
    shell completes a unique prefix; the tools' names start with different letters, so every prefix is unique."""
    return next((tool for tool in TOOLS if name and tool.startswith(name)), None)


def parse_call(reply: str) -> tuple[str, str] | None:
    """(tool, argument) when the reply is a call in the documented format `name:argument` (`name` a tool's name or a
    prefix of it; the argument is the rest of the reply, 1 to 64 characters once stripped), else None."""
    match = CALL.match(reply)
    tool = tool_named(match.group(1)) if match else None
    if match is None or tool is None:
        return None
    argument = match.group(2).strip()
    return (tool, argument) if 1 <= len(argument) <= 64 else None


def call_shape(reply: str) -> float:
    """The share of a call's two fixed parts that `reply` has in place: a tool's name or a prefix of it at the start
    (leading whitespace aside), then `:` right after it. `c` or `calc` 1/2, `c:` and `calc:` (and every valid call)
    1, `x:` and `1` 0. In place, not anywhere in the reply: counted anywhere, a policy learned to scatter the
    letters of `calc` through a 20-token reply (the share stuck at 0.6, no valid call)."""
    text = reply.lstrip()
    k = 0  # the longest start of the reply that is a tool's name or a prefix of it (`cx:1`: `c`)
    while k < len(text) and tool_named(text[: k + 1]) is not None:
        k += 1
    if k == 0:
        return 0.0
    return 1.0 if text[k : k + 1] == ":" else 0.5


REWARD_WEIGHTS = {"answer": 0.7, "valid_call": 0.2, "call_shape": 0.1}


# The tool message's most characters (an error's text is cut there), so that every episode fits a 128-token context:
# prompt <= 14, first reply <= 21 (its <|end|> included), tool message <= 3 + 48, final answer <= 20: 106. Uncut, a
# syntax error's text (88 characters) left no room for the answer: a 400, and the group and the run failed.
MAX_TOOL_REPLY = 48


def run_tool(name: str, argument: str) -> tuple[str, bool]:
    """(the tool message's content, at most MAX_TOOL_REPLY characters; True when the tool answered)."""
    try:
        return str(TOOLS[name](argument))[:MAX_TOOL_REPLY], True
    except ToolError as exc:
        return f"error: {exc}"[:MAX_TOOL_REPLY], False


class ToolsEnvironment(Environment):
    name = "tools"
    max_turns = 2
    max_tokens = 20

    def __init__(self, seed: int = 0, *, tasks_per_split: int = 400, **options: Any) -> None:
        super().__init__(seed, **options)
        self._tasks = {split: self._make(split, tasks_per_split) for split in ("train", "held_out")}

    def _make(self, split: str, count: int) -> list[Task]:
        rng = random.Random(f"{self.seed}:{split}")
        tasks = []
        for index in range(count):
            if index % 2:
                item = rng.choice(sorted(PRICES))
                question, answer, tool = f"price {item}", str(PRICES[item]), "lookup"
            else:
                a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(1, 99)
                question = f"{a}*{b}+{c}"
                answer, tool = str(calc(question)), "calc"
            tasks.append(Task(index, ({"role": "user", "content": question},), answer, {"tool": tool}))
        return tasks

    def tasks(self, split: Split) -> list[Task]:
        return self._tasks[split]

    async def run_episode(self, client: Any, session_id: str, task: Task, *, model: str = "policy") -> EpisodeResult:
        messages = list(task.messages)
        result = EpisodeResult(reward=0.0, exact=0.0, parts=dict.fromkeys(REWARD_WEIGHTS, 0.0))
        reply = ""
        for turn in range(self.max_turns):
            reply = await chat(client, session_id, messages, model=model, max_tokens=self.max_tokens)
            result.turns += 1
            call = parse_call(reply)
            if turn == 0:
                result.parts["call_shape"] = call_shape(reply)
            if call is None or turn == self.max_turns - 1:
                break
            result.tool_calls += 1
            result.valid_tool_calls += 1
            result.parts["valid_call"] = 1.0
            content, answered = run_tool(*call)
            result.tool_errors += 0 if answered else 1
            messages += [
                {"role": "assistant", "content": reply},
                {"role": "tool", "content": content, "tool_call_id": f"call_{turn}"},
            ]
        if result.turns == 1 and parse_call(reply) is None and CALL.match(reply):
            result.tool_calls += 1  # a call of an unknown tool: counted, not valid
        result.parts["answer"] = float(reply.strip() == task.answer)
        result.exact = result.parts["answer"]
        # Rounded so that every part earned sums to exactly 1.0 (0.7 + 0.2 + 0.1 is 0.9999999999999999 in floats).
        result.reward = round(sum(weight * result.parts[name] for name, weight in REWARD_WEIGHTS.items()), 12)
        return result
