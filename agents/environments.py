"""The environment interface and its registry: what an agent episode is, and how a run's config names one.

An `Environment` hands out tasks (`tasks(split)`: the sampler picks one by index, so a task is identified by its
split and index and a resumed run sees the same ones), and `run_episode(client, session_id, task)` drives one
episode with a real `openai.AsyncOpenAI` client pointed at the run's session server, turn by turn, then scores
it. The client is the only way an episode reaches the policy: everything the policy saw and produced is in the
session server's trajectory record, which is what training uses (never the text of the replies re-tokenized).

Names: the built-in environments below, any installed under the `rlcp.environments` entry-point group, and a
`module:Class` path only when staff listed that exact string as allowed (the platform's
`AGENT_ENVIRONMENTS_ALLOWED`): a run config never makes this process import what nobody allowed.
"""

from __future__ import annotations

import importlib
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar, Literal

Split = Literal["train", "held_out"]
ENTRY_POINT_GROUP = "rlcp.environments"
BUILTIN: dict[str, str] = {
    "digits": "agents.envs.digits:DigitsEnvironment",
    "tools": "agents.envs.tools:ToolsEnvironment",
    "code": "agents.envs.code:CodeEnvironment",
}
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,199}:[A-Za-z_][A-Za-z0-9_]{0,99}$")


@dataclass(frozen=True)
class Task:
    """One problem: the opening conversation and what a right answer is."""

    index: int
    messages: tuple[dict[str, str], ...]
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OneTurn:
    """The one request an episode of a one-turn environment makes (`Environment.one_turn`): its messages, its
    max_tokens and its logit_bias (OpenAI's: token id as a string -> bias)."""

    messages: tuple[dict[str, str], ...]
    max_tokens: int
    logit_bias: dict[str, int] | None = None


@dataclass
class EpisodeResult:
    """What an episode earned. `parts` are the reward's named components (the run page charts them);
    `tool_calls`, `tool_errors` and `valid_tool_calls` count what the agent asked of its tools."""

    reward: float
    exact: float
    parts: dict[str, float] = field(default_factory=dict)
    turns: int = 0
    tool_calls: int = 0
    valid_tool_calls: int = 0
    tool_errors: int = 0


class Environment(ABC):
    """Subclass, give it a `name`, and register it (entry point or allowed path). One instance serves many
    concurrent episodes: keep per-episode state in `run_episode`'s locals."""

    name: ClassVar[str]
    max_turns: int = 1
    max_tokens: int = 16  # per request, the stop token included (an instance may set its own)

    def __init__(self, seed: int = 0, **options: Any) -> None:
        self.seed = seed
        self.options = options

    @abstractmethod
    def tasks(self, split: Split) -> list[Task]:
        """Every task of the split, in a fixed order (the same for the same seed and options)."""

    @abstractmethod
    async def run_episode(self, client: Any, session_id: str, task: Task, *, model: str = "policy") -> EpisodeResult:
        """Drive one episode through `client` (openai.AsyncOpenAI) on session `session_id`, then score it."""

    # A one-turn environment (an episode is one request, scored on its reply alone) describes that request in
    # `one_turn` and scores a reply in `score_reply`. Then:
    # - a whole group runs as ONE request with `n` choices on one session (each choice an episode): one client
    #   request, one server request and one engine request of n rows for the group, where `run_episode` makes
    #   n of each (`runs_groups`, `run_group`);
    # - evaluation asks the same request greedily of the learner's weights, the version just published
    #   (trainer/agent_episodes.py `evaluate_one_turn`), as the in-process task is evaluated.
    runs_groups: ClassVar[bool] = False

    def one_turn(self, task: Task) -> OneTurn | None:
        """The one request of an episode of `task`; None (the default) for an environment whose episodes take
        several requests or tools."""
        return None

    def score_reply(self, task: Task, reply: str) -> EpisodeResult:
        """A one-turn episode's result from its reply's text."""
        raise NotImplementedError(f"environment {self.name!r} is not a one-turn environment")

    async def run_group(
        self, client: Any, session_id: str, task: Task, n: int, *, model: str = "policy", seed: int | None = None
    ) -> list[EpisodeResult]:
        """`n` episodes of `task` as one request with `n` choices on session `session_id`, scored in choice order;
        `seed` (OpenAI's) fixes the request's samples (the worker passes the group's, as the in-process path
        seeds a group's turn: the same tokens whichever engine serves it, and a rerun draws them again)."""
        turn = self.one_turn(task)
        if not self.runs_groups or turn is None:
            raise NotImplementedError(f"environment {self.name!r} runs one session per episode (runs_groups is False)")
        replies = await chat_choices(
            client,
            session_id,
            list(turn.messages),
            model=model,
            max_tokens=turn.max_tokens,
            n=n,
            logit_bias=turn.logit_bias,
            seed=seed,
        )
        return [self.score_reply(task, reply) for reply in replies]


async def chat(
    client: Any,
    session_id: str,
    messages: list[dict[str, str]],
    *,
    model: str,
    max_tokens: int,
    greedy: bool = False,
    logit_bias: dict[str, int] | None = None,
) -> str:
    """One turn: the policy's reply to `messages` on `session_id` (the session id travels in the body);
    `logit_bias` is OpenAI's (token id as a string -> bias), e.g. to keep a reply to the characters that can
    score."""
    [reply] = await chat_choices(
        client, session_id, messages, model=model, max_tokens=max_tokens, n=1, greedy=greedy, logit_bias=logit_bias
    )
    return reply


async def chat_choices(
    client: Any,
    session_id: str,
    messages: list[dict[str, str]],
    *,
    model: str,
    max_tokens: int,
    n: int,
    greedy: bool = False,
    logit_bias: dict[str, int] | None = None,
    seed: int | None = None,
) -> list[str]:
    """One request for `n` replies to `messages` (OpenAI's `n`), in choice order. With n > 1 the session takes no
    further request: each choice is its own episode."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "n": n,
        "temperature": 0.0 if greedy else 1.0,
        "session_id": session_id,
    }
    if logit_bias:
        body["logit_bias"] = logit_bias
    if seed is not None:
        body["seed"] = seed
    reply = await chat_completion(client, body)
    by_index = {c["index"]: c["message"].get("content") or "" for c in reply["choices"]}
    if sorted(by_index) != list(range(n)):
        raise ValueError(f"asked {n} choices, got indices {sorted(by_index)}")
    return [by_index[k] for k in range(n)]


async def chat_completion(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    """`POST /chat/completions` with `body`, the answer as parsed JSON, through the client's low-level `post`
    (the openai README's "custom/undocumented requests"): the client's base URL, key, timeout, transport and
    error types (a refusal raises `openai.APIStatusError` with its `status_code`, as `chat.completions.create`
    does), without the typed layer's request transform and response models. Those cost about 3 ms of CPU per
    request (5.5 -> 2.4 ms in a loopback probe with 4 choices), and a rollout worker sends some 200 requests per
    training step of the digit task on the same cores as the engines and the learner."""
    answer = await client.post("/chat/completions", cast_to=object, body=body)
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        raise ValueError(f"not a chat completion: {str(answer)[:200]}")
    return answer


class UnknownEnvironment(ValueError):
    """The config names an environment that is neither built in, installed, nor allowed by staff."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"environment {name!r}: {why}")
        self.name = name


def available(allowed: Iterable[str] = ()) -> list[str]:
    """Every name a run may use here: built-ins, installed entry points, and staff-allowed paths."""
    names = set(BUILTIN) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names | set(allowed))


def resolve(name: str, allowed: Iterable[str] = ()) -> type[Environment]:
    """The Environment class a config names; UnknownEnvironment when it is not built in, installed or allowed."""
    if not isinstance(name, str) or not name:
        raise UnknownEnvironment(str(name)[:100], "must be a non-empty string")
    if name in BUILTIN:
        return _load(name, BUILTIN[name])
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return _check(name, ep.load())
    if ":" in name:
        if not _PATH.match(name):
            raise UnknownEnvironment(name[:100], "not a module:Class path")
        if name not in set(allowed):
            raise UnknownEnvironment(name, "not in the staff's allowed environments (AGENT_ENVIRONMENTS_ALLOWED)")
        return _load(name, name)
    raise UnknownEnvironment(name[:100], f"unknown; available: {', '.join(available(allowed))}")


def _load(name: str, path: str) -> type[Environment]:
    module, _, attr = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise UnknownEnvironment(name, f"cannot be loaded ({type(exc).__name__}: {exc})") from exc
    return _check(name, cls)


def _check(name: str, cls: Any) -> type[Environment]:
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise UnknownEnvironment(name, "is not an agents.environments.Environment subclass")
    return cls
