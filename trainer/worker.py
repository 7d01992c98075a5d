"""A rollout worker: runs group episodes turn by turn, routing each session to one engine (affinity).

Driven by `rollout.RolloutScheduler` through `generate_group(ticket, batch_id) -> GroupResult`: the worker's
filters judge a finished group; a kept one is put into the run's channel (trainer/data_path.py) and the
scheduler gets a receipt (no payload; `attempt` names this try), a dropped one only a receipt. An engine that
dies takes its sessions with it: they are tombstoned in the router, the episode is aborted and its ticket goes
back to the sampler to be run again as a new session. The same happens when an engine evicted the session's
KV cache (its memory bound) or aborted its request (the engine answers `SessionGoneError`, never a turn computed
without the session's context), to an episode that waited at a sealed gate past the engine's admission bound,
and to the episodes running when `abort_episodes` is called (quiesce before a checkpoint): they stop between
turns, never mid-request. Plain class; `trainer.topology` deploys it as an async
Ray actor with `max_concurrency >= capacity`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from typing import Any

from rollout.channel import Channel
from rollout.coalesce import CallCoalescer
from rollout.errors import (
    AdmissionTimeoutError,
    EpisodeAbortedError,
    GatePoisonedError,
    NoEngineError,
    RouterFullError,
    SessionGoneError,
)
from rollout.filters import apply_filters
from rollout.invoke import call, is_ray_actor
from rollout.router import SessionAffinityRouter
from rollout.types import GroupResult, TurnCall
from trainer.config import TrainConfig
from trainer.data_path import build_filters, channel_key
from trainer.episodes import GroupTicket, run_group
from trainer.problems import VOCAB, task_build

POISONED_BACKOFF_S = 1.0  # an episode refused by a poisoned gate is handed back this much later


def _engine_died(exc: BaseException) -> bool:
    try:
        from ray.exceptions import RayActorError
    except ImportError:  # pragma: no cover - ray is a hard dependency of the topology, not of this module
        return False
    return isinstance(exc, RayActorError)


def _not_admitted(exc: BaseException) -> str | None:
    """Why the engine refused to admit the request (also through a RayTaskError), or None: `gate_wait` (it
    waited at a closed gate past its bound) or `gate_poisoned` (the gate waits for its owner's reset)."""
    for error in (exc, getattr(exc, "cause", None)):
        if isinstance(error, AdmissionTimeoutError):
            return "gate_wait"
        if isinstance(error, GatePoisonedError):
            return "gate_poisoned"
    return None


class RolloutWorker:
    def __init__(
        self, cfg: TrainConfig, worker_id: str, engines: dict[str, Any], *, channel: str, serving: Any = None
    ) -> None:
        # No torch in a worker: it routes turns and scores episodes (tests/trainer/test_torch_free.py).
        self.cfg, self.worker_id = cfg, worker_id
        self.task = task_build(cfg)
        self.agents: Any = None  # an agent environment's episodes over HTTP (trainer/agent_episodes.py)
        if cfg.environment:
            from trainer.agent_episodes import AgentEpisodes

            if serving is None:
                raise ValueError(f"environment {cfg.environment!r} needs the run's session server")
            self.agents = AgentEpisodes(cfg, serving, prefix=worker_id)
        self.engines = dict(engines)
        # One generate_many call per engine per tick of this worker's loop carries every turn sent that tick.
        self._turns = {e: CallCoalescer(h, "generate_many") for e, h in self.engines.items()}
        self.router = SessionAffinityRouter(sorted(self.engines))
        self.channel = Channel.connect(channel)  # kept groups go there (the learner takes them)
        self.key = channel_key(cfg)
        self.filters = build_filters(cfg)
        self._attempt = itertools.count()
        self.aborted = 0  # episodes aborted (their groups go back to the sampler and run again)
        self.sessions_gone = 0  # of them: the engine no longer had the session's cache
        self.aborted_by: Counter[str] = Counter()  # engine_lost | gate_wait | gate_poisoned | quiesce | router_full
        self._abort_epoch = 0  # abort_episodes() bumps it: episodes started before stop at their next turn
        self._live = 0
        self._suspended: set[str] = set()  # engines whose gate is poisoned: no new session until resume_engines

    async def generate_group(self, ticket: GroupTicket, batch_id: Any = None) -> GroupResult:
        """Run G episodes of the ticket's prompt as one session on one engine; abort if that engine dies."""
        session_id = f"{self.worker_id}:g{ticket.group_id}:a{next(self._attempt)}"
        started_at = time.time()  # wall clock: the rollout event's spans (trace export) compare across processes
        epoch = self._abort_epoch

        ended = False  # the engine answered the final turn and so ended the session itself

        async def generate(*args: Any, **kwargs: Any) -> dict[str, Any]:
            nonlocal ended
            if self._abort_epoch != epoch:  # between turns: no request of this episode is in flight
                raise EpisodeAbortedError(session_id, "quiesce", "asked to stop before a checkpoint")
            out = await self._generate(*args, **kwargs)
            ended = bool(out.get("ended"))  # the engine's answer says whether it ended the session
            return out

        self._live += 1
        try:
            if self.agents is not None:  # G sessions on the session server, driven by the environment's agent
                group = await self.agents.run_group(ticket)
            else:
                group = await run_group(
                    self.task,
                    ticket,
                    self.task.train_prompts[ticket.prompt_index],
                    group_size=self.cfg.group_size,
                    seed=self.cfg.seed,
                    generate=generate,
                    session_id=session_id,
                )
        except (SessionGoneError, NoEngineError, EpisodeAbortedError, RouterFullError) as exc:
            kind = exc.kind if isinstance(exc, EpisodeAbortedError) else "engine_lost"
            if isinstance(exc, RouterFullError):  # back-pressure, never a run failure: the ticket runs again
                kind = "router_full"
                await asyncio.sleep(POISONED_BACKOFF_S)
            if isinstance(exc, NoEngineError) and self._suspended:
                kind = "gate_poisoned"
                await asyncio.sleep(POISONED_BACKOFF_S)  # every engine waits for a reset
            self.aborted += 1
            self.aborted_by[kind] += 1
            meta = {"reason": str(exc), "kind": kind}
            return GroupResult(rewards=[], aborted=True, group_id=ticket.group_id, meta=meta)
        finally:
            self._live -= 1
            await self._end_session(session_id, ended_by_engine=ended)
        if self.agents is not None:  # the environment's reward judges the replies; an episode is valid if it ran
            valid = [bool(row.turns) for row in group.rows]
        else:
            valid = [all(VOCAB[t].isdigit() for t in row.generated()) for row in group.rows]
        group.meta["attempt"] = session_id
        receipt = GroupResult(
            rewards=group.rewards,
            valid=valid,
            attempt_ids=group.sample_ids,
            group_id=ticket.group_id,
            attempt=session_id,
            meta={
                "versions": group.versions,
                "engines": group.engines,
                "worker": self.worker_id,
                "started_at": started_at,
            },
        )
        verdict = apply_filters(self.filters, receipt)
        if verdict.keep:
            await self.channel.put_async(group, key=self.key)  # before the receipt: it never names a missing item
        else:
            receipt.filtered = verdict.reason
        receipt.meta["ended_at"] = time.time()
        return receipt

    async def _generate(
        self,
        session_id: str,
        new_tokens: list[list[int]],
        n: int,
        seed: int,
        request_id: str,
        greedy: bool,
        continues: bool = False,
        last: bool = False,
    ) -> dict[str, Any]:
        engine_id = self.router.acquire(session_id)  # SessionGoneError for a tombstoned session
        reported: int | None = None
        self.router.request_started(engine_id)
        try:
            turn = TurnCall(session_id, new_tokens, n, seed, request_id, greedy, continues, last)
            out: dict[str, Any] = await self._turns[engine_id].submit(turn)
            reported = out.get("inflight")
            return out
        except SessionGoneError as exc:
            # The engine dropped the session's cache (evicted under its memory bound, or aborted): the
            # episode cannot go on without its context; the group is aborted and re-run as a new session.
            self.sessions_gone += 1
            self.router.remove_session(session_id, engine_id, getattr(exc, "reason", str(exc)))
            raise
        except Exception as exc:
            if _engine_died(exc):
                self.engine_lost(engine_id, reason=f"died: {type(exc).__name__}")
                raise SessionGoneError(session_id, engine_id, "died mid-request") from exc
            refused = _not_admitted(exc)
            if refused is not None:  # never admitted: nothing ran, the episode can be re-run safely
                if refused == "gate_poisoned":
                    self._suspend(engine_id, str(getattr(exc, "cause", exc)))
                    await asyncio.sleep(POISONED_BACKOFF_S)  # do not spin while the engine waits for a reset
                raise EpisodeAbortedError(session_id, refused, str(getattr(exc, "cause", exc))) from exc
            raise
        finally:
            self.router.request_finished(engine_id, reported=reported)

    async def _end_session(self, session_id: str, *, ended_by_engine: bool = False) -> None:
        """The episode is over: forget its route and free its cache on the engine, unless the engine ended the
        session with the answer to its final turn (one Ray call fewer per group: the common case)."""
        engine_id = self.router.engine_of(session_id)
        if engine_id is None:
            return  # tombstoned (its engine died): keep the tombstone so the id is never re-routed
        self.router.release(session_id)
        if not ended_by_engine and engine_id in self.engines:
            handle = self.engines[engine_id]
            if is_ray_actor(handle):
                handle.end_session.remote(session_id)  # fire and forget: only frees cache memory
            else:
                await call(handle, "end_session", session_id)

    def engine_lost(self, engine_id: str, reason: str = "died") -> list[str]:
        """Tombstone the sessions bound to a dead engine and stop routing to it."""
        if engine_id not in self.engines:
            return []
        del self.engines[engine_id]
        del self._turns[engine_id]
        return self.router.remove_engine(engine_id, reason=reason)

    def engine_added(self, engine_id: str, handle: Any) -> None:
        """Route new sessions to a (re)started engine too; sessions of its dead predecessor stay tombstoned."""
        if engine_id in self.engines:
            self.engine_lost(engine_id, reason="replaced by a restarted engine")
        self.engines[engine_id] = handle
        self._turns[engine_id] = CallCoalescer(handle, "generate_many")
        self.router.add_engine(engine_id)

    def _suspend(self, engine_id: str, reason: str) -> None:
        """A poisoned gate refused a request: route nothing to that engine until `resume_engines` (its sessions
        are tombstoned: their next turn aborts, as the gate would refuse it anyway)."""
        if engine_id in self.engines and engine_id not in self._suspended:
            self._suspended.add(engine_id)
            self.router.remove_engine(engine_id, reason=f"gate poisoned: {reason}")

    def resume_engines(self) -> list[str]:
        """After a staff gate reset (trainer/controls.py): the suspended engines take new sessions again."""
        back = sorted(e for e in self._suspended if e in self.engines)
        for engine_id in back:
            self.router.add_engine(engine_id)
        self._suspended.clear()
        return back

    def abort_episodes(self) -> int:
        """Episodes running now stop at their next turn (aborted, their groups re-run); returns how many run."""
        self._abort_epoch += 1
        return self._live

    def stats(self) -> dict[str, Any]:
        return {
            "worker": self.worker_id,
            "aborted": self.aborted,
            "sessions_gone": self.sessions_gone,
            "aborted_by": dict(self.aborted_by),
            "live": self._live,
            "suspended": sorted(self._suspended),
            "engines": sorted(self.engines),
            "router": self.router.snapshot(),
            "turn_calls": {e: c.stats() for e, c in sorted(self._turns.items())},
            "agents": dict(self.agents.counts) if self.agents is not None else {},
        }

    async def close(self) -> None:
        if self.agents is not None:
            await self.agents.client.close()  # its aiohttp session and connections
        await asyncio.sleep(0)
