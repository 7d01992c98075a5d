"""`tools`: a multi-turn agent that must call a tool to answer.

Each task is a question the policy cannot answer from the text alone: an arithmetic expression (`"7*8+3"`,
tool `calc`) or the price of an item in a table it never sees (`"price pear"`, tool `lookup`). The documented
text format of a tool call is the whole reply `name(argument)`, e.g. `calc(7*8+3)` or `lookup(pear)`. The
environment runs the tool, sends its result back as a `tool` message, and the policy's next reply is its final
answer (just the number). Replies that are not a tool call end the episode as the final answer.

Reward: 0.3 for a valid tool call (a known tool, a well-formed argument) plus 0.7 for the right final answer;
exact = the final answer is right. Counted per episode: tool calls, valid ones, tool errors (a call the tool
could not answer)."""

from __future__ import annotations

import ast
import operator
import random
import re
from typing import Any

from agents.environments import Environment, EpisodeResult, Split, Task, chat

CALL = re.compile(r"^\s*([a-z]{1,16})\((.{1,64})\)\s*$", re.S)
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


def parse_call(reply: str) -> tuple[str, str] | None:
    """(tool, argument) when the reply is a call of a known tool in the documented format, else None."""
    match = CALL.match(reply)
    if not match or match.group(1) not in TOOLS:
        return None
    return match.group(1), match.group(2)


def run_tool(name: str, argument: str) -> tuple[str, bool]:
    """(the tool message's content, True when the tool answered)."""
    try:
        return str(TOOLS[name](argument)), True
    except ToolError as exc:
        return f"error: {exc}", False


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
        result = EpisodeResult(reward=0.0, exact=0.0, parts={"valid_call": 0.0, "answer": 0.0})
        reply = ""
        for turn in range(self.max_turns):
            reply = await chat(client, session_id, messages, model=model, max_tokens=self.max_tokens)
            result.turns += 1
            call = parse_call(reply)
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
        result.reward = 0.3 * result.parts["valid_call"] + 0.7 * result.parts["answer"]
        return result
