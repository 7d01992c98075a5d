"""What the proxy to a run's session server forwards (runs/api/proxy.py does the HTTP): which paths and methods,
how a caller's session id is namespaced, and the envelope a request body must have. Pure functions, no I/O.

- Paths (under `/api/runs/<id>/v1/`): `chat/completions` and `completions` (POST), `models` (GET) and
  `sessions/<session id>/trajectory` (GET). Anything else is 404, a known path with another method 405.
- Session ids: the caller's (body `session_id`, else header `X-Session-Id`, else a fresh one) must be 1-128
  characters of `[A-Za-z0-9._:-]`; upstream it becomes `ext-<user id>-<id>`, so an external session can never
  name a training session (those never start with `ext-`) or another user's session.
- Bodies: a JSON object (already decoded within the platform's JSON limits) whose OpenAI fields have the types
  and bounds below; the session server checks the rest (context length, sampling ranges) and its 400 is relayed.
docs/api.md, "Talking to a run's policy".
"""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass
from typing import Any

SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
EXTERNAL_PREFIX = "ext-"
MESSAGES_MAX = 256  # messages of one chat request
PROMPTS_MAX = 16  # prompts of one completions request
PARTS_MAX = 64  # content parts of one message
N_MAX = 8  # choices per request
MAX_TOKENS_MAX = 32768  # tokens asked for one answer (the session server refuses what its context cannot hold)
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
POST_PATHS = frozenset({"chat/completions", "completions"})
TRAJECTORY = re.compile(r"sessions/([^/]+)/trajectory")


class ProxyRefused(Exception):
    """A request the proxy refuses before forwarding: `status` (400, 404, 405), the message and the field."""

    def __init__(self, status: int, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.status, self.field, self.message = status, field, message


@dataclass(frozen=True)
class Route:
    """A forwardable request: the upstream path after `/v1/` (session id already namespaced where it is in the
    path) and whether the request carries a chat/completions body."""

    upstream_path: str
    has_body: bool
    session_in_path: str | None = None  # the caller's session id, for a trajectory read


def route(path: str, method: str, user_id: int) -> Route:
    """The route of `path` (what follows `/v1/`) for `method`; ProxyRefused 404 or 405 otherwise."""
    if path in POST_PATHS:
        if method != "POST":
            raise ProxyRefused(405, f"v1/{path} takes POST", field="method")
        return Route(upstream_path=path, has_body=True)
    if path == "models":
        if method != "GET":
            raise ProxyRefused(405, "v1/models takes GET", field="method")
        return Route(upstream_path=path, has_body=False)
    match = TRAJECTORY.fullmatch(path)
    if match is not None:
        if method != "GET":
            raise ProxyRefused(405, "v1/sessions/<id>/trajectory takes GET", field="method")
        session = session_id_check(match.group(1), field="session_id")
        namespaced = external_session(user_id, session)
        return Route(upstream_path=f"sessions/{namespaced}/trajectory", has_body=False, session_in_path=session)
    raise ProxyRefused(404, f"v1/{path[:100]} is not forwarded (chat/completions, completions, models, sessions)")


def session_id_check(value: Any, *, field: str) -> str:
    if not isinstance(value, str) or not SESSION_ID.fullmatch(value):
        raise ProxyRefused(400, "must be 1-128 characters of letters, digits and . _ : -", field=field)
    return value


def session_id_choose(body: dict[str, Any] | None, header: str | None) -> tuple[str, bool]:
    """The caller's session id (body `session_id`, else the `X-Session-Id` header) and False, or a fresh one and
    True."""
    if body is not None and body.get("session_id") is not None:
        return session_id_check(body["session_id"], field="session_id"), False
    if header:
        return session_id_check(header, field="X-Session-Id"), False
    return uuid.uuid4().hex, True


def external_session(user_id: int, session: str) -> str:
    """The session id the session server sees: namespaced by the calling user."""
    return f"{EXTERNAL_PREFIX}{user_id}-{session}"


def body_check(path: str, body: Any) -> dict[str, Any]:
    """`body` when it is a chat/completions request the proxy may forward; ProxyRefused 400 naming the field."""
    if not isinstance(body, dict):
        raise ProxyRefused(400, "the body must be a JSON object", field="body")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise ProxyRefused(400, "must be true or false", field="stream")
    _int_in(body, "n", 1, N_MAX)
    for name in ("max_tokens", "max_completion_tokens"):
        _int_in(body, name, 1, MAX_TOKENS_MAX)
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value is not None and not (_number(value) and math.isfinite(value)):
            raise ProxyRefused(400, "must be a number", field=name)
    if not isinstance(body.get("model", ""), str):
        raise ProxyRefused(400, "must be a string", field="model")
    if path == "chat/completions":
        _messages_check(body.get("messages"))
    else:
        _prompt_check(body.get("prompt"))
    return body


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int_in(body: dict[str, Any], name: str, low: int, high: int) -> None:
    value = body.get(name)
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ProxyRefused(400, f"must be an integer from {low} to {high}", field=name)


def _messages_check(messages: Any) -> None:
    if not isinstance(messages, list) or not 1 <= len(messages) <= MESSAGES_MAX:
        raise ProxyRefused(400, f"must be a list of 1 to {MESSAGES_MAX} messages", field="messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ProxyRefused(400, "must be an object", field=where)
        if message.get("role") not in ROLES:
            raise ProxyRefused(400, f"must be one of {', '.join(sorted(ROLES))}", field=f"{where}.role")
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list) or len(content) > PARTS_MAX:
            raise ProxyRefused(
                400, f"must be a string or a list of at most {PARTS_MAX} text parts", field=f"{where}.content"
            )
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ProxyRefused(400, 'must be {"type": "text", "text": <string>}', field=f"{where}.content[{j}]")


def _prompt_check(prompt: Any) -> None:
    if isinstance(prompt, str):
        return
    if (
        not isinstance(prompt, list)
        or not 1 <= len(prompt) <= PROMPTS_MAX
        or not all(isinstance(p, str) for p in prompt)
    ):
        raise ProxyRefused(400, f"must be a string or a list of 1 to {PROMPTS_MAX} strings", field="prompt")
