"""A generation engine: a policy copy at some weight version, a request gate, and per-session KV caches.

Every request is admitted by the engine's `RequestGate` (so a publication can seal, drain, install v+1 and
reopen) and tags its tokens with the lease's version and request id. A session's later turns only feed their
new tokens: the conversation so far lives in the session's cache, which is why routing is sticky. Plain class;
`trainer.topology` deploys it as an async Ray actor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from rollout.gate import RequestGate
from trainer.config import TrainConfig
from trainer.policy import KVCache, build_policy, sample_tokens
from trainer.problems import task_build


@dataclass
class SessionCache:
    kv: KVCache | None
    pending: torch.Tensor | None  # (G, 1) last sampled token, not yet fed through the model
    version: int  # weight version that computed the cache
    last_used: float


class Engine:
    def __init__(
        self,
        cfg: TrainConfig,
        engine_id: str,
        *,
        initially_open: bool = True,
        max_sessions: int = 4096,
        threads: int = 1,
    ) -> None:
        torch.set_num_threads(threads)  # the whole CPUs of its bundle (trainer/resources.py), at least one
        self.cfg, self.engine_id, self.max_sessions = cfg, engine_id, max_sessions
        task = task_build(cfg)
        torch.manual_seed(cfg.seed)  # same initial weights as the learner's version 0
        self.model = build_policy(cfg, task.vocab_size, task.block_size()).eval()
        self.gate = RequestGate(name=engine_id, version=0, initially_open=initially_open)
        self.sessions: dict[str, SessionCache] = {}
        self.tokens_fed = 0  # tokens run through the model (prompt + new turn tokens), shows cache reuse
        self.requests = 0

    # --- generation -------------------------------------------------------------------------------------
    async def generate(
        self, session_id: str, new_tokens: list[list[int]], n: int, seed: int, request_id: str, greedy: bool = False
    ) -> dict[str, Any]:
        """Feed the new tokens of this turn after the session's cache and sample `n` tokens per row."""
        async with self.gate.lease(session_id, request_id=request_id, timeout=self.cfg.publish_deadline_s * 4) as lease:
            return self._generate(session_id, new_tokens, n, seed, greedy, lease.version, request_id)

    def _generate(
        self,
        session_id: str,
        new_tokens: list[list[int]],
        n: int,
        seed: int,
        greedy: bool,
        version: int,
        request_id: str,
    ) -> dict[str, Any]:
        feed = torch.tensor(new_tokens, dtype=torch.long)  # (G, t)
        sess = self.sessions.get(session_id)
        if sess is not None and sess.pending is not None:
            feed = torch.cat([sess.pending, feed], dim=1)
        gen = torch.Generator().manual_seed(seed)
        tokens, logps, kv, pending = sample_tokens(
            self.model,
            feed,
            sess.kv if sess else None,
            n,
            temperature=self.cfg.temperature,
            generator=gen,
            greedy=greedy,
        )
        self.tokens_fed += feed.numel() + tokens.shape[0] * (n - 1)
        self.requests += 1
        self.sessions[session_id] = SessionCache(kv=kv, pending=pending, version=version, last_used=time.monotonic())
        if len(self.sessions) > self.max_sessions:  # bounded memory: evict the least recently used
            oldest = min(self.sessions, key=lambda s: self.sessions[s].last_used)
            del self.sessions[oldest]
        return {
            "tokens": tokens.tolist(),
            "logprobs": logps.tolist(),
            "version": version,
            "request_id": request_id,
            "engine": self.engine_id,
        }

    def end_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    # --- publication protocol (rollout.PublicationController) --------------------------------------------
    def seal(self) -> None:
        self.gate.seal()

    async def drain(self, timeout_s: float) -> None:
        await self.gate.drain(timeout_s=timeout_s)

    def install_version(self, version: int, weights: dict[str, torch.Tensor] | None = None) -> None:
        self.gate.install_version(version)
        if weights is not None:
            self.model.load_state_dict(weights)

    def reopen(self) -> None:
        self.gate.reopen()

    def reset(self, reason: str) -> str | None:
        """Clear a poisoned gate (staff resolved the unknown outcomes: trainer/controls.py); it stays sealed."""
        return self.gate.reset(reason)

    def snapshot(self) -> dict[str, Any]:
        snap = self.gate.snapshot()
        snap.update(sessions=len(self.sessions), tokens_fed=self.tokens_fed, requests=self.requests)
        return snap

    def ping(self) -> str:
        return self.engine_id
