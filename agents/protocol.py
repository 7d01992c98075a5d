"""What crosses the session server's HTTP boundary: the request bodies it accepts (pydantic, unknown fields
ignored), the limits on every size and count from outside (`Limits`), and the OpenAI error shape (`ApiError`).

Validation order per request: bearer key (401), body size (413 `{detail, limit}`), JSON (400), the pydantic
model (400 naming the field, e.g. `messages.3.content`), then `check_*` against the limits and the model's
block size (400 naming the field). Nothing here knows about engines or sessions.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

SESSION_ID = re.compile(r"^[A-Za-z0-9._:@/-]{1,128}$")


@dataclass(frozen=True)
class Limits:
    """Caps on what one request or the whole server may hold; every one is checked before any engine work."""

    max_body_bytes: int = 1_000_000
    max_messages: int = 256
    max_content_chars: int = 16_384
    max_sessions: int = 1024  # live sessions the affinity router binds; more: 503 with Retry-After
    max_records: int = 4096  # session records kept (live, gone, not yet ended); more: 503
    max_logit_bias: int = 300  # entries of one request's logit_bias (OpenAI's own cap)
    max_choices: int = 64  # n: choices of one request (a GRPO group's episodes)
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_messages",
            "max_content_chars",
            "max_sessions",
            "max_records",
            "max_logit_bias",
            "max_choices",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


class ApiError(Exception):
    """An answer other than 200, in the OpenAI error shape: {"error": {message, type, param, code}}."""

    def __init__(
        self, status: int, message: str, *, type: str, param: str | None = None, code: str | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code or type
        self.extra = extra  # more top-level keys (413: detail, limit)

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return {"error": error, **self.extra}


def bad_request(param: str | None, message: str) -> ApiError:
    return ApiError(400, message, type="invalid_request_error", param=param)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: StrictStr


class _Generation(_Body):
    model: StrictStr | None = None  # ignored: a run serves one policy
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    n: StrictInt = 1
    temperature: StrictFloat | StrictInt | None = None
    stream: StrictBool = False
    session_id: StrictStr | None = None
    seed: StrictInt | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: StrictStr | list[StrictStr] | None = None
    logprobs: StrictBool | None = None
    # OpenAI's: token id (a decimal string) -> a number in [-100, 100] added to its logit before sampling.
    logit_bias: dict[StrictStr, StrictFloat] | None = None  # strict: ints are numbers, bools and strings are not


class ChatRequest(_Generation):
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(_Generation):
    prompt: StrictStr
    # The legacy API's logprobs is a count, the chat API's a flag: the field narrows differently per request.
    logprobs: StrictInt | StrictBool | None = None  # type: ignore[assignment]


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:
        raise bad_request(None, "request body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(None, f"request body is not valid JSON: {exc}") from None


def parse_body(model: type[_Generation], data: Any, limits: Limits) -> Any:
    """The validated request; 400 naming the first bad field. Sizes are checked before the model sees them."""
    if not isinstance(data, dict):
        raise bad_request(None, "request body must be a JSON object")
    messages = data.get("messages")
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise bad_request("messages", f"at most {limits.max_messages} messages, got {len(messages)}")
    bias = data.get("logit_bias")
    if isinstance(bias, dict) and len(bias) > limits.max_logit_bias:
        raise bad_request("logit_bias", f"at most {limits.max_logit_bias} entries, got {len(bias)}")
    try:
        req = model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise bad_request(param, f"{param}: {first['msg']}") from None
    except RecursionError:
        raise bad_request(None, "request body is nested too deeply") from None
    if not 1 <= req.n <= limits.max_choices:
        raise bad_request("n", f"n must be between 1 and {limits.max_choices}, got {req.n}")
    if req.n > 1 and req.stream:
        raise bad_request("n", "stream needs n = 1 (choices are not streamed)")
    if req.temperature is not None and req.temperature not in (0, 1):
        raise bad_request("temperature", "temperature must be 0 (greedy) or 1 (the run's sampling temperature)")
    if req.stop is not None and req.stop not in ("<|end|>", ["<|end|>"], []):
        raise bad_request("stop", 'only "<|end|>" is a stop sequence here (chat turns always stop at it)')
    for i, m in enumerate(getattr(req, "messages", [])):
        if len(m.content) > limits.max_content_chars:
            raise bad_request(f"messages.{i}.content", f"at most {limits.max_content_chars} characters")
    if isinstance(req, CompletionRequest) and len(req.prompt) > limits.max_content_chars * limits.max_messages:
        raise bad_request("prompt", f"at most {limits.max_content_chars * limits.max_messages} characters")
    return req


def logit_bias(req: _Generation, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """The request's logit_bias as sorted (token id, bias) pairs; 400 naming `logit_bias.<key>` for a key that is
    not a token id of the vocabulary or a bias outside [-100, 100]."""
    pairs: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        param = f"logit_bias.{key[:20]}"
        if not (key.isascii() and key.isdigit() and len(key) <= 9 and int(key) < vocab_size):
            raise bad_request(param, f"keys must be token ids in [0, {vocab_size}) written as decimal strings")
        if not -100 <= value <= 100:  # also refuses NaN (json.loads reads it); infinities are outside the range
            raise bad_request(param, f"bias must be a number in [-100, 100], got {value!r}")
        pairs[int(key)] = float(value)
    return tuple(sorted(pairs.items()))


def requested_tokens(req: _Generation, block_size: int) -> int | None:
    """max_tokens (or max_completion_tokens) when given, at most the model's block size (else 400)."""
    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(req, name)
        if value is not None:
            if value > block_size:
                raise bad_request(name, f"{name} must be at most the model's context of {block_size} tokens")
            return int(value)
    return None


def session_of(body_id: str | None, header_id: str | None) -> str | None:
    """The session id from the body's `session_id` or the `X-Session-Id` header (None: a one-off session)."""
    if body_id is not None and header_id is not None and body_id != header_id:
        raise bad_request("session_id", "session_id and the X-Session-Id header name different sessions")
    sid = body_id if body_id is not None else header_id
    if sid is not None and not SESSION_ID.match(sid):
        raise bad_request("session_id", "session_id must be 1-128 characters of A-Z a-z 0-9 . _ : @ / -")
    return sid
