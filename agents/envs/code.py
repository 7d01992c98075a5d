"""`code`: the agent may run a Python snippet in the sandbox (agents/sandbox.py) before it answers.

Tasks are the `tools` environment's arithmetic questions (`"7*8+3"`). The documented text format of a tool call
is a reply that starts with `run:` followed by the code, e.g. `run:print(7*8+3)`. The snippet runs in the
sandbox (no network, no files of the run, CPU/memory/output/time limits); its standard output, cut to 200
characters, comes back as the `tool` message, or `error: <what went wrong>` when the sandbox reports it (a tool
error: a timeout, a limit, a refused escape, an exception). The next reply is the final answer.

Reward: 0.3 for a snippet that ran and printed something, plus 0.7 for the right final answer."""

from __future__ import annotations

from typing import Any

from agents.environments import Environment, EpisodeResult, Split, Task, chat
from agents.envs.tools import ToolsEnvironment
from agents.sandbox import run_snippet
from agents.sandbox_types import SandboxLimits

PREFIX = "run:"
REPLY_CHARS = 200


def snippet_of(reply: str) -> str | None:
    """The code of a reply in the documented format, else None."""
    text = reply.strip()
    return text[len(PREFIX) :] if text.startswith(PREFIX) and len(text) > len(PREFIX) else None


async def run_code(code: str, limits: SandboxLimits | None = None) -> tuple[str, bool]:
    """(the tool message's content, True when the snippet ran cleanly and printed something)."""
    result = await run_snippet(code, limits=limits)
    if not result.ok:
        return f"error: {result.error}: {result.detail}"[:REPLY_CHARS], False
    out = result.stdout.strip()[:REPLY_CHARS]
    return (out, True) if out else ("error: the snippet printed nothing", False)


class CodeEnvironment(Environment):
    name = "code"
    max_turns = 2
    max_tokens = 40

    def __init__(self, seed: int = 0, *, tasks_per_split: int = 400, **options: Any) -> None:
        super().__init__(seed, **options)
        arithmetic = ToolsEnvironment(seed, tasks_per_split=2 * tasks_per_split)
        self._tasks = {
            split: [t for t in arithmetic.tasks(split) if t.meta["tool"] == "calc"] for split in ("train", "held_out")
        }
        self.limits = SandboxLimits(cpu_s=1, wall_s=5)

    def tasks(self, split: Split) -> list[Task]:
        return self._tasks[split]

    async def run_episode(self, client: Any, session_id: str, task: Task, *, model: str = "policy") -> EpisodeResult:
        messages = list(task.messages)
        result = EpisodeResult(reward=0.0, exact=0.0, parts={"ran": 0.0, "answer": 0.0})
        reply = await chat(client, session_id, messages, model=model, max_tokens=self.max_tokens)
        result.turns = 1
        code = snippet_of(reply)
        if code is not None:
            result.tool_calls = 1
            content, ran = await run_code(code, self.limits)
            result.valid_tool_calls = int(ran)
            result.tool_errors = int(not ran)
            result.parts["ran"] = float(ran)
            messages += [
                {"role": "assistant", "content": reply},
                {"role": "tool", "content": content, "tool_call_id": "call_0"},
            ]
            reply = await chat(client, session_id, messages, model=model, max_tokens=self.max_tokens)
            result.turns = 2
        result.parts["answer"] = float(reply.strip() == task.answer)
        result.exact = result.parts["answer"]
        result.reward = 0.3 * result.parts["ran"] + 0.7 * result.parts["answer"]
        return result
