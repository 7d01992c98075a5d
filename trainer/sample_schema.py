"""The `sample` event's data: one captured episode (prompt, turns, reward and its parts, advantage, versions),
its type, its limits and its validation. Shared by the trainer (builds it, `trainer.samples`), the platform
(stores it in its own table, runs/samples/) and the browser (frontend/static/src/lib/samples.ts mirrors it)."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

FINISH_REASONS: frozenset[str] = frozenset({"stop", "length", "aborted"})
PICKS: frozenset[str] = frozenset({"sampled", "best", "worst"})
TURN_ROLES: frozenset[str] = frozenset({"policy", "tool"})
MAX_SAMPLE_TEXT = 8_000  # characters of a prompt, a completion or one turn's text
MAX_SAMPLE_TURNS = 64
MAX_REWARD_PARTS = 32
MAX_SAMPLE_NAME = 200  # characters of a session, engine or request id or a reward part's name

FinishReason = Literal["stop", "length", "aborted"]


class SampleTurn(TypedDict, total=False):
    """One turn of an episode: the policy's generation (with the weight version and engine that served it)
    or a tool's reply."""

    role: str  # policy | tool
    text: str
    version: int  # policy turns: weight version of every token of the turn
    engine: str  # policy turns
    request: str  # policy turns: the generation request id


class SampleData(TypedDict):
    """`data` of a `sample` event: one episode of a trained group, as the step that consumed it saw it."""

    step: int  # the training step that consumed it (its version after the step)
    group: int  # the group's global id (trainer.episodes.Group.group_id)
    index: int  # position of the episode in its group (0..G-1)
    prompt_index: int  # the task prompt: the same prompt across steps shares it
    session: str  # the session (worker, group, attempt) its turns ran in
    engine: str  # the engine that served its last turn
    finish_reason: str  # stop | length | aborted
    pick: str  # why it was captured: sampled | best | worst (its group's mean reward)
    prompt: str
    completion: str  # every policy turn's text, concatenated
    turns: list[SampleTurn]
    reward: float
    reward_parts: dict[str, float]
    advantage: float
    version_min: int
    version_max: int
    staleness: int  # step - 1 - version_min: versions between its oldest token and the weights it trained
    length: int  # generated tokens


_CONFIG = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, frozen=True)
SampleInt = Annotated[int, Field(gt=-(2**62), lt=2**62)]
SampleName = Annotated[str, StringConstraints(max_length=MAX_SAMPLE_NAME)]
SampleText = Annotated[str, StringConstraints(max_length=MAX_SAMPLE_TEXT)]


class SampleTurnModel(BaseModel):
    model_config = _CONFIG

    role: SampleName
    text: SampleText
    version: SampleInt | None = None
    engine: SampleName | None = None
    request: SampleName | None = None


class SampleModel(BaseModel):
    """SampleData as trainer/event_schema.py declares it: types and bounds; undeclared fields are dropped."""

    model_config = _CONFIG

    step: SampleInt
    group: SampleInt
    index: SampleInt
    prompt_index: SampleInt
    session: SampleName
    engine: SampleName
    finish_reason: SampleName
    pick: SampleName
    prompt: SampleText
    completion: SampleText
    turns: Annotated[list[SampleTurnModel], Field(max_length=MAX_SAMPLE_TURNS)]
    reward: float
    reward_parts: Annotated[dict[SampleName, float], Field(max_length=MAX_REWARD_PARTS)]
    advantage: float
    version_min: SampleInt
    version_max: SampleInt
    staleness: SampleInt
    length: SampleInt


_INTS = ("step", "group", "index", "prompt_index", "version_min", "version_max", "staleness", "length")
_FLOATS = ("reward", "advantage")
_NAMES = ("session", "engine")
REQUIRED_SAMPLE_KEYS: frozenset[str] = frozenset(
    {*_INTS, *_FLOATS, *_NAMES, "finish_reason", "pick", "prompt", "completion", "turns", "reward_parts"}
)


def sample_data_check(data: dict[str, Any]) -> str | None:
    """Why `data` is not a valid sample (a message starting with the field's path), or None."""
    for key in _INTS:
        value = data[key]
        if not isinstance(value, int) or isinstance(value, bool) or not -(2**62) < value < 2**62:
            return f"data.{key}: expected an integer"
    for key in _FLOATS:
        if not _finite(data[key]):
            return f"data.{key}: expected a finite number"
    for key in _NAMES:
        if not _text(data[key], MAX_SAMPLE_NAME):
            return f"data.{key}: expected a string of at most {MAX_SAMPLE_NAME} characters"
    if data["finish_reason"] not in FINISH_REASONS:
        return f"data.finish_reason: expected one of {sorted(FINISH_REASONS)}"
    if data["pick"] not in PICKS:
        return f"data.pick: expected one of {sorted(PICKS)}"
    for key in ("prompt", "completion"):
        if not _text(data[key], MAX_SAMPLE_TEXT):
            return f"data.{key}: expected a string of at most {MAX_SAMPLE_TEXT} characters"
    parts = data["reward_parts"]
    if not isinstance(parts, dict) or len(parts) > MAX_REWARD_PARTS:
        return f"data.reward_parts: expected an object of at most {MAX_REWARD_PARTS} numbers"
    if not all(_text(k, MAX_SAMPLE_NAME) and _finite(v) for k, v in parts.items()):
        return "data.reward_parts: expected names mapped to finite numbers"
    turns = data["turns"]
    if not isinstance(turns, list) or len(turns) > MAX_SAMPLE_TURNS:
        return f"data.turns: expected a list of at most {MAX_SAMPLE_TURNS} turns"
    for i, turn in enumerate(turns):
        problem = _turn_check(turn)
        if problem:
            return f"data.turns[{i}]{problem}"
    return None


def _turn_check(turn: Any) -> str | None:
    if not isinstance(turn, dict) or turn.get("role") not in TURN_ROLES:
        return f": expected an object with role one of {sorted(TURN_ROLES)}"
    if not _text(turn.get("text"), MAX_SAMPLE_TEXT):
        return f".text: expected a string of at most {MAX_SAMPLE_TEXT} characters"
    version = turn.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or not -(2**62) < version < 2**62:
        return ".version: expected an integer"
    for key in ("engine", "request"):
        if not _text(turn.get(key, ""), MAX_SAMPLE_NAME):
            return f".{key}: expected a string of at most {MAX_SAMPLE_NAME} characters"
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _text(value: Any, most: int) -> bool:
    return isinstance(value, str) and len(value) <= most
