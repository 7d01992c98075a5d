"""Episodes of an agent environment over HTTP (docs/agents.md): a rollout worker opens G internal sessions on
the run's session server, the environment drives them at once with a real `openai.AsyncOpenAI` client, and the
group is built from the server's token-exact records (trainer/trajectories.py), never from the replies' text.
An environment that `runs_groups` (one turn per episode) runs the group as one session and one request with
`n` = G choices instead, each choice an episode (`split_choices`).

A session the server answers 410 for (its engine died or evicted it) or 503 for (the gate stayed sealed past
its admission bound, or is poisoned; the router is full) aborts the group like the in-process path does: its
ticket goes back to the sampler and runs again as new sessions. Greedy evaluation of held-out and training
tasks runs from the driver: episodes through the session server (`evaluate_env`), or, for a one-turn environment,
its one request asked of the learner's weights (`evaluate_one_turn`), the version just published.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agents.chat import VOCAB_SIZE, decode, render
from agents.environments import Environment, EpisodeResult, OneTurn, Task, resolve
from rollout.coalesce import CallCoalescer
from rollout.errors import EpisodeAbortedError, SessionGoneError
from rollout.invoke import call
from trainer.config import TrainConfig
from trainer.episodes import Group, GroupTicket, generation_seed
from trainer.problems import policy_shape
from trainer.trajectories import TrajectoryRecord, group_from_trajectories, split_choices

if TYPE_CHECKING:
    from trainer.evaluate import OneTurnRequest

REQUEST_TIMEOUT_S = 300.0  # one request may wait at a sealed gate for a whole publication
# Internal sessions a worker opens per `open_sessions` call, ahead of the groups that use them: a group takes its
# sessions from that pool, so opening costs an actor call per POOL_SESSIONS sessions, not one per tick or two.
POOL_SESSIONS = 32


@dataclass(frozen=True)
class Serving:
    """How a worker reaches the run's session server: its handle (sessions, records), URL and bearer key."""

    server: Any
    url: str
    key: str


def build_environment(cfg: TrainConfig) -> Environment:
    """The environment the config names. The platform checked the name against the staff's allowed list at
    submit (runs/api), so the job accepts the name it was launched with."""
    return resolve(cfg.environment, allowed=[cfg.environment])(seed=cfg.seed)


def openai_client(serving: Serving) -> Any:
    """The official client on the openai package's aiohttp transport: its default httpx transport rescanned its
    connection pool on every request (about a quarter of a rollout worker's CPU at 64 sessions, py-spy)."""
    from openai import AsyncOpenAI, DefaultAioHttpClient

    return AsyncOpenAI(
        base_url=f"{serving.url}/v1",
        api_key=serving.key,
        max_retries=0,
        timeout=REQUEST_TIMEOUT_S,
        http_client=DefaultAioHttpClient(timeout=REQUEST_TIMEOUT_S),
    )


def _abort_kind(exc: BaseException) -> str | None:
    """The in-process path's abort kind for an HTTP refusal, or None when the failure is not a refusal."""
    status = getattr(exc, "status_code", None)
    return {410: "engine_lost", 503: "gate_wait"}.get(status) if isinstance(status, int) else None


class ServerSessions:
    """A worker's internal sessions on the session server, opened ahead in batches and ended in shared calls.

    `take(k)` hands out k opened sessions from a pool that one `open_sessions` call refills (POOL_SESSIONS at a
    time); `end(sids)` ends them and returns their records through one `end_many` call in flight at a time (the
    groups that end while it runs share the next: rollout/coalesce.py `single_flight`). Opening per group (an
    `open_many` call per tick, since removed) cost a worker one actor call per 1.9 groups (the digit task's 180 groups
    per step). Ids are `<prefix>-<random>:p<n>`: a restarted worker never reuses one that is still open."""

    def __init__(self, server: Any, prefix: str = "") -> None:
        self.server, self.prefix = server, f"{prefix or 'w'}-{secrets.token_hex(3)}"
        self._pool: list[str] = []  # opened, not taken yet
        self._opening = asyncio.Lock()  # one refill at a time; callers that need sessions meanwhile wait for it
        self._ids = itertools.count()
        self._end = CallCoalescer(server, "end_many", single_flight=True)

    async def take(self, k: int) -> list[str]:
        if k < 1:
            raise ValueError(f"take needs at least one session, got {k}")
        async with self._opening:
            if len(self._pool) < k:
                fresh = [f"{self.prefix}:p{next(self._ids)}" for _ in range(max(k, POOL_SESSIONS))]
                await call(self.server, "open_sessions", fresh)
                self._pool += fresh
            taken, self._pool = self._pool[:k], self._pool[k:]
            return taken

    async def end(self, sids: list[str]) -> Any:
        """The sessions' final records, in order (their group's outcome of `end_many`: a bad id raises here)."""
        return await self._end.submit(sids)


class AgentEpisodes:
    """One worker's agent episodes: G sessions per group on the session server, driven by the environment."""

    def __init__(self, cfg: TrainConfig, serving: Serving, prefix: str = "") -> None:
        self.cfg, self.serving = cfg, serving
        self.env = build_environment(cfg)
        self.tasks = self.env.tasks("train")
        self.client = openai_client(serving)
        self.sessions = ServerSessions(serving.server, prefix)
        self.block_size = policy_shape(cfg)[1]
        self.counts: Counter[str] = Counter()  # tool_calls, valid_tool_calls, tool_errors, episodes

    async def run_group(self, ticket: GroupTicket) -> Group:
        """G episodes of the ticket's task: one internal session each, or, for an environment that runs groups,
        one session whose one request asks G choices (sessions from the pool, `ServerSessions`); aborts raise
        EpisodeAbortedError or SessionGoneError (the worker re-queues the ticket)."""
        task = self.tasks[ticket.prompt_index]
        G = self.cfg.group_size
        one = self.env.runs_groups
        sids = await self.sessions.take(1 if one else G)
        runs: list[Awaitable[Any]]
        if one:
            seed = generation_seed(self.cfg.seed, ticket.group_id, 0)  # the in-process path's seed for this turn
            runs = [self.env.run_group(self.client, sids[0], task, G, seed=seed)]
        else:
            runs = [self.env.run_episode(self.client, sid, task) for sid in sids]
        try:
            outcome: list[Any] = list(await asyncio.gather(*runs, return_exceptions=True))
        finally:
            records = await self.sessions.end(sids)
        for sid, result in zip(sids, outcome):
            if isinstance(result, BaseException):
                kind = _abort_kind(result)
                if kind == "engine_lost":
                    raise SessionGoneError(sid, "", f"session server answered 410: {result}") from result
                if kind is not None:
                    raise EpisodeAbortedError(sid, kind, f"session server answered 503: {result}") from result
                raise result
        episodes: list[EpisodeResult] = outcome[0] if one else outcome
        self._count(episodes)
        plain = [
            split
            for k, r in enumerate(records)
            for split in split_choices(TrajectoryRecord.from_plain(_plain(r), f"records[{k}]"), f"records[{k}]")
        ]
        return group_from_trajectories(
            ticket,
            plain,
            [e.reward for e in episodes],
            exact=[e.exact for e in episodes],
            max_tokens=session_tokens(self.block_size),
            vocab_size=VOCAB_SIZE,
            meta={
                "reward_parts": [e.parts for e in episodes],
                "environment": self.env.name,
                "weight": self.cfg.group_size * episode_budget(self.env),
            },
        )

    def _count(self, episodes: list[EpisodeResult]) -> None:
        self.counts["episodes"] += len(episodes)
        for e in episodes:
            self.counts["tool_calls"] += e.tool_calls
            self.counts["valid_tool_calls"] += e.valid_tool_calls
            self.counts["tool_errors"] += e.tool_errors


def session_tokens(block_size: int) -> int:
    """Tokens one session may hold: the policy's context plus the last sampled token, which the engine keeps pending
    outside its cache (the server's room check, agents/sessions.py `max_new_tokens`, allows it). Training feeds the
    policy a row but its last token (`sequence_logprobs`), so a row this long fits its context. Bounded by the
    context alone, a tools episode that filled the context to its last token failed its group and the run."""
    return block_size + 1


def spread(tasks: list[Task], n: int) -> list[Task]:
    """A fixed, evenly spread subset of `n` tasks (the same every evaluation, so curves are comparable)."""
    if len(tasks) <= n:
        return list(tasks)
    return [tasks[int(i * len(tasks) / n)] for i in range(n)]


def episode_budget(env: Environment) -> int:
    """Tokens one episode may generate at most: its channel weight (groups of an environment weigh the same,
    so the learner's token-weighted take is exactly `prompts_per_step` groups)."""
    return env.max_turns * env.max_tokens


def _plain(record: Any) -> Any:
    return record.model_dump() if hasattr(record, "model_dump") else record


async def evaluate_env(env: Environment, serving: Serving, tasks: list[Task], prefix: str) -> dict[str, float]:
    """Greedy episodes of `tasks` through the session server: mean exact-match and reward. Their sessions are
    internal but never reach a worker's channel: they are ended and dropped."""
    client = openai_client(serving)
    greedy = _Greedy(client)

    sids = [f"{prefix}:e{k}" for k in range(len(tasks))]
    await call(serving.server, "open_sessions", sids)
    try:
        results = await asyncio.gather(*(env.run_episode(greedy, sid, t) for sid, t in zip(sids, tasks)))
    finally:
        await call(serving.server, "end_sessions", sids)
        await client.close()
    return _summary(results)


def evaluate_one_turn(
    env: Environment, tasks: list[Task], turns: list[OneTurn], replies_of: Callable[[list[OneTurnRequest]], Any]
) -> dict[str, float]:
    """Greedy episodes of a one-turn environment's `tasks` without the session server: each task's one request
    (`turns`, the environment's `one_turn`) rendered with the chat template, answered greedily by `replies_of`
    (the learner's `greedy_replies`: the weights just published, the same logit_bias, cut before `<|end|>` as
    a chat reply is), and scored by `score_reply`. The same answers as greedy requests through the server, at a
    fraction of the CPU: one call for all tasks, where the server path makes one request per task."""
    requests: list[OneTurnRequest] = [
        (
            render(list(turn.messages)),
            turn.max_tokens,
            sorted((int(k), float(v)) for k, v in (turn.logit_bias or {}).items()),
        )
        for turn in turns
    ]
    replies = replies_of(requests)
    results = [env.score_reply(task, decode(ids)) for task, ids in zip(tasks, replies)]
    return _summary(results)


def _summary(results: list[EpisodeResult]) -> dict[str, float]:
    """Greedy evaluation's numbers: mean exact-match and reward over the episodes (0 for none)."""
    n = max(1, len(results))
    return {"exact_match": sum(r.exact for r in results) / n, "reward": sum(r.reward for r in results) / n}


class _Greedy:
    """The client an environment sees during evaluation: every chat completion is asked greedily."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.chat = self
        self.completions = self

    async def create(self, **kwargs: Any) -> Any:
        return await self._client.chat.completions.create(**{**kwargs, "temperature": 0.0})

    async def post(self, path: str, *, cast_to: Any, body: dict[str, Any]) -> Any:
        """The low-level call `agents.environments.chat_completion` makes, greedy as well."""
        return await self._client.post(path, cast_to=cast_to, body={**body, "temperature": 0.0})
