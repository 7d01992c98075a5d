"""Ragged groups from the session server's trajectory records: training on the token ids exactly as recorded.

When an agent drives an episode over HTTP (issue 24), the run's session server records per session every
request as a segment: the ids it fed (system, user and tool turns, template specials), the ids the engine
generated, their behaviour log-probs, the weight version of each generated token, the request id, the engine
and the finish reason. `TrajectoryRecord` is that record as the trainer consumes it (its fields match
`agents.trajectory.Trajectory` on the session server's branch; `TrajectoryRecord.from_plain` reads its
`model_dump()`). `group_from_trajectories` lays each record's segments end to end into one row of a ragged
`Group`: fed ids with loss mask 0, generated ids with mask 1, their recorded log-probs and versions. Nothing
is decoded or re-encoded: text can encode to other ids than the ones the policy sampled (a special token's text
spelled out character by character), and the policy must be trained on what it sampled.

Records come from outside the trainer, so every count has a bound and bad input raises `TrajectoryError`
naming the field (`records[2].segments[0].logprobs`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer.episodes import Group, GroupTicket, Row, Turn

FINISH_REASONS = ("stop", "length", "disconnected")
KINDS = ("internal", "external")  # external: opened through the platform proxy, never trained on
STATES = ("open", "ended", "gone")  # gone: its engine lost the session (410): the episode is incomplete
MAX_ROWS = 1024  # episodes in one group
_RECORD_KEYS = {"session_id", "kind", "engine", "state", "gone_reason", "segments"}
_SEGMENT_KEYS = {"request_id", "prompt_ids", "completion_ids", "logprobs", "versions", "finish_reason", "engine"}
_OPTIONAL_SEGMENT_KEYS = {"logit_bias", "choice"}
MAX_BIAS = 300  # logit_bias entries of one segment (the session server's own cap)


class TrajectoryError(ValueError):
    """A record or an argument cannot make a group; `field` names where (`records[1].segments[0].versions`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class TrajectorySegment:
    """One request of a session: what it fed, what the engine generated, under which lease."""

    request_id: str
    prompt_ids: list[int]  # fed by this request (the engine's pending last token is not repeated)
    completion_ids: list[int]
    logprobs: list[float]  # per completion token: its behaviour log-prob
    versions: list[int]  # per completion token: the weight version (the gate's, at the request's lease)
    finish_reason: str  # stop | length | disconnected
    engine: str
    logit_bias: tuple[tuple[int, float], ...] = ()  # (id, bias) its tokens were sampled under; training uses it
    choice: int = 0  # which of its request's n choices (a session answered with n > 1 holds one segment each)


@dataclass(frozen=True)
class TrajectoryRecord:
    """Every segment of one session, in order."""

    session_id: str
    kind: str = "internal"
    state: str = "ended"
    segments: list[TrajectorySegment] = field(default_factory=list)

    @classmethod
    def from_plain(cls, data: Any, where: str = "record") -> TrajectoryRecord:
        """A record from plain data: the session server's `Trajectory.model_dump()` (its `engine` and
        `gone_reason` are read past), or JSON of it."""
        body = _mapping(data, where, _RECORD_KEYS)
        segments = body.get("segments", [])
        if not isinstance(segments, list):
            raise TrajectoryError(f"{where}.segments", "must be a list")
        return cls(
            session_id=_string(body.get("session_id"), f"{where}.session_id"),
            kind=_string(body.get("kind", "internal"), f"{where}.kind"),
            state=_string(body.get("state", "ended"), f"{where}.state"),
            segments=[_segment_from_plain(s, f"{where}.segments[{j}]") for j, s in enumerate(segments)],
        )


def split_choices(record: TrajectoryRecord, where: str = "record") -> list[TrajectoryRecord]:
    """One record per choice: a session whose only request asked n > 1 choices holds one segment per choice (the
    same request and prompt), each an episode of its own, `<session>#<k>`; any other record is itself."""
    choices = [s.choice for s in record.segments]
    if not any(choices):
        return [record]
    if choices != list(range(len(choices))):
        raise TrajectoryError(
            f"{where}.segments", f"a session with choices holds one segment per choice 0..n-1, got {choices[:8]}"
        )
    return [
        TrajectoryRecord(f"{record.session_id}#{k}", record.kind, record.state, [dataclasses.replace(seg, choice=0)])
        for k, seg in enumerate(record.segments)
    ]


def group_from_trajectories(
    ticket: GroupTicket,
    records: Sequence[TrajectoryRecord],
    rewards: Sequence[float],
    *,
    max_tokens: int,
    vocab_size: int,
    exact: Sequence[float] | None = None,
    meta: dict[str, Any] | None = None,
) -> Group:
    """One ragged group: row k is `records[k]`'s segments end to end with reward `rewards[k]` (and exact-match
    `exact[k]`; by default 1.0 where the reward is 1.0). A row may hold at most `max_tokens` tokens (the
    policy's context) and ids below `vocab_size`. External sessions, sessions their engine lost, and sessions
    that generated nothing are refused."""
    if not 1 <= len(records) <= MAX_ROWS:
        raise TrajectoryError("records", f"need 1 to {MAX_ROWS} records (one per episode), got {len(records)}")
    if len(rewards) != len(records):
        raise TrajectoryError("rewards", f"need one reward per record ({len(records)}), got {len(rewards)}")
    exact = [1.0 if r == 1.0 else 0.0 for r in rewards] if exact is None else exact
    if len(exact) != len(records):
        raise TrajectoryError("exact", f"need one value per record ({len(records)}), got {len(exact)}")
    for name, values in (("rewards", rewards), ("exact", exact)):
        for k, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise TrajectoryError(f"{name}[{k}]", f"must be a finite number, got {v!r}")
    rows = [_row(record, f"records[{k}]", max_tokens, vocab_size) for k, record in enumerate(records)]
    return Group(
        group_id=ticket.group_id,
        epoch=ticket.epoch,
        prompt_index=ticket.prompt_index,
        rows=rows,
        rewards=[float(r) for r in rewards],
        exact=[float(e) for e in exact],
        meta=dict(meta or {}),
    )


def _row(record: TrajectoryRecord, where: str, max_tokens: int, vocab_size: int) -> Row:
    """One record as a row: fed ids mask 0, log-prob 0.0, version -1; generated ids as recorded, mask 1."""
    if not isinstance(record, TrajectoryRecord):
        raise TrajectoryError(where, f"must be a TrajectoryRecord, got {type(record).__name__}")
    if record.kind != "internal":
        raise TrajectoryError(f"{where}.kind", f"only internal sessions are trained on, got {record.kind!r}")
    if record.state not in STATES or record.state == "gone":
        raise TrajectoryError(
            f"{where}.state", f"must be 'open' or 'ended' (a gone session is incomplete), got {record.state!r}"
        )
    if not record.segments or not record.segments[0].prompt_ids:
        raise TrajectoryError(f"{where}.segments", "a session starts with a request that fed at least one token")
    if any(seg.choice for seg in record.segments):
        raise TrajectoryError(f"{where}.segments", "holds a request's n choices: one record per choice (split_choices)")
    if len(record.segments) > max_tokens:
        raise TrajectoryError(f"{where}.segments", f"more than {max_tokens} segments")
    tokens: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    versions: list[int] = []
    turns: list[Turn] = []
    for j, seg in enumerate(record.segments):
        at = f"{where}.segments[{j}]"
        _check_segment(seg, at, vocab_size)
        if len(tokens) + len(seg.prompt_ids) + len(seg.completion_ids) > max_tokens:
            raise TrajectoryError(f"{where}.segments", f"the session holds more than {max_tokens} tokens (from {at})")
        n = len(seg.prompt_ids)
        tokens += seg.prompt_ids
        logprobs += [0.0] * n
        mask += [0] * n
        versions += [-1] * n
        if seg.completion_ids:
            turns.append(
                Turn(
                    len(tokens),
                    len(tokens) + len(seg.completion_ids),
                    seg.request_id,
                    seg.engine,
                    seg.finish_reason,
                    tuple(seg.logit_bias),
                )
            )
            tokens += seg.completion_ids
            logprobs += [float(x) for x in seg.logprobs]
            mask += [1] * len(seg.completion_ids)
            versions += seg.versions
    if not turns:
        raise TrajectoryError(f"{where}.segments", "the session generated no token: nothing to train on")
    return Row(session=record.session_id, tokens=tokens, logprobs=logprobs, mask=mask, versions=versions, turns=turns)


def _check_segment(seg: TrajectorySegment, at: str, vocab_size: int) -> None:
    n = len(seg.completion_ids)
    if len(seg.logprobs) != n or len(seg.versions) != n:
        name = "logprobs" if len(seg.logprobs) != n else "versions"
        raise TrajectoryError(f"{at}.{name}", f"need one entry per completion token ({n})")
    for name in ("prompt_ids", "completion_ids"):
        for i, t in enumerate(getattr(seg, name)):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
                raise TrajectoryError(f"{at}.{name}[{i}]", f"must be a token id in [0, {vocab_size}), got {t!r}")
    for i, lp in enumerate(seg.logprobs):
        if isinstance(lp, bool) or not isinstance(lp, int | float) or not (math.isfinite(lp) and lp <= 0.0):
            raise TrajectoryError(f"{at}.logprobs[{i}]", f"must be a finite log-probability (<= 0), got {lp!r}")
    for i, v in enumerate(seg.versions):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise TrajectoryError(f"{at}.versions[{i}]", f"must be a weight version (int >= 0), got {v!r}")
    if seg.finish_reason not in FINISH_REASONS:
        raise TrajectoryError(
            f"{at}.finish_reason", f"must be one of {', '.join(FINISH_REASONS)}, got {seg.finish_reason!r}"
        )
    if not isinstance(seg.request_id, str) or not seg.request_id:
        raise TrajectoryError(f"{at}.request_id", "must be a non-empty string")
    if not isinstance(seg.engine, str):
        raise TrajectoryError(f"{at}.engine", "must be a string")
    if len(seg.logit_bias) > MAX_BIAS:
        raise TrajectoryError(f"{at}.logit_bias", f"at most {MAX_BIAS} entries")
    for i, pair in enumerate(seg.logit_bias):
        token, value = pair if isinstance(pair, tuple | list) and len(pair) == 2 else (None, None)
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise TrajectoryError(f"{at}.logit_bias[{i}]", f"must be [token id in [0, {vocab_size}), bias]")
        if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
            raise TrajectoryError(f"{at}.logit_bias[{i}]", f"bias must be a number in [-100, 100], got {value!r}")


def _segment_from_plain(data: Any, where: str) -> TrajectorySegment:
    body = _mapping(data, where, _SEGMENT_KEYS | _OPTIONAL_SEGMENT_KEYS)
    missing = sorted(_SEGMENT_KEYS - set(body))
    if missing:
        raise TrajectoryError(f"{where}.{missing[0]}", "missing")
    lists = {name: body[name] for name in ("prompt_ids", "completion_ids", "logprobs", "versions")}
    for name, value in lists.items():
        if not isinstance(value, list):
            raise TrajectoryError(f"{where}.{name}", "must be a list")
    choice = body.get("choice", 0)
    if isinstance(choice, bool) or not isinstance(choice, int) or not 0 <= choice < MAX_ROWS:
        raise TrajectoryError(f"{where}.choice", f"must be a choice index in [0, {MAX_ROWS}), got {choice!r}")
    bias = body.get("logit_bias", [])
    if not isinstance(bias, list | tuple):
        raise TrajectoryError(f"{where}.logit_bias", "must be a list of [token id, bias] pairs")
    return TrajectorySegment(
        logit_bias=tuple(tuple(p) if isinstance(p, list | tuple) else p for p in bias),
        choice=choice,
        request_id=_string(body["request_id"], f"{where}.request_id"),
        finish_reason=_string(body["finish_reason"], f"{where}.finish_reason"),
        engine=_string(body["engine"], f"{where}.engine"),
        **{name: list(value) for name, value in lists.items()},
    )


def _mapping(data: Any, where: str, known: set[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise TrajectoryError(where, f"must be an object, got {type(data).__name__}")
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise TrajectoryError(f"{where}.{unknown[0]}", "unknown field")
    return data


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise TrajectoryError(where, f"must be a string, got {type(value).__name__}")
    return value
