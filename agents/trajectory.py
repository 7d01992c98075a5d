"""Token-exact trajectories: what a session server records per session, and what training builds from it.

A record holds the ids the engine was fed and the ids it generated, never text: an assistant turn is not
re-encoded (its text may encode to other ids, agents/chat.py). `training_arrays` lays the segments end to end:
fed ids (system, user, tool turns and the template's specials) carry no loss; generated ids carry loss, their
behaviour log-prob and the weight version of the lease that produced them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

FinishReason = Literal["stop", "length", "disconnected"]


class Segment(BaseModel):
    """One request of a session: what was fed, what came back, under which lease."""

    request_id: str
    prompt_ids: list[int]  # fed by this request (the engine's pending last token is not repeated here)
    completion_ids: list[int]
    logprobs: list[float]  # per completion token, under the sampling distribution
    versions: list[int]  # per completion token: the gate version of the request's lease
    finish_reason: FinishReason
    engine: str
    # the request's logit_bias, (token id, bias) pairs: its tokens were sampled from softmax(logits / T + bias),
    # and training computes their log-probs under the same bias
    logit_bias: list[tuple[int, float]] = Field(default_factory=list)
    # which of the request's `n` choices this is: a request with n > 1 (a session's only request) records one
    # segment per choice, all with the same request id and prompt; each choice is an episode of its own
    choice: int = 0


class Trajectory(BaseModel):
    """Every segment of one session, in order; `kind` external: opened over HTTP alone, never trained on."""

    session_id: str
    kind: Literal["internal", "external"]
    engine: str | None = None
    state: Literal["open", "gone", "ended"] = "open"
    gone_reason: str = ""
    segments: list[Segment] = Field(default_factory=list)

    @property
    def length(self) -> int:
        return sum(len(s.prompt_ids) + len(s.completion_ids) for s in self.segments if s.choice == 0)

    @property
    def choices(self) -> int:
        return 1 + max((s.choice for s in self.segments), default=0)

    def training_arrays(self) -> tuple[list[int], list[int], list[float], list[int]]:
        """(tokens, loss_mask, logprobs, versions), one entry per token of the session (of its first choice); fed
        tokens have mask 0, logprob 0.0 and version -1; generated tokens mask 1 with their recorded log-prob and
        version."""
        tokens: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        for s in self.segments:
            if s.choice:
                continue
            tokens += s.prompt_ids + s.completion_ids
            mask += [0] * len(s.prompt_ids) + [1] * len(s.completion_ids)
            logprobs += [0.0] * len(s.prompt_ids) + s.logprobs
            versions += [-1] * len(s.prompt_ids) + s.versions
        return tokens, mask, logprobs, versions
