"""What the session server keeps per session besides its record: the conversation it has seen and how many
tokens the engine's cache holds, and how a new request's body becomes the ids to feed (pure: no I/O).

OpenAI clients resend the whole history. A new chat request must repeat the session's messages exactly (the
assistant's replies as the server returned them) and add at least one; only the added messages are rendered
and fed, after the engine's cache. The assistant turns are never re-encoded: their recorded ids are in the
cache. A completion request's prompt must start with the session's text so far (prompt + returned text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agents.chat import STOP, EncodeError, TemplateError, decode, encode, render
from agents.protocol import ChatMessage, bad_request
from agents.trajectory import Segment, Trajectory


@dataclass
class SessionState:
    record: Trajectory
    api: Literal["chat", "completions"] | None = None  # fixed by the session's first request
    messages: list[tuple[str, str]] = field(default_factory=list)  # (role, content) seen, replies included
    text: str = ""  # completions: prompt and returned text so far
    last_stopped: bool = True  # the last completion ended with <|end|> (else one is fed before the next turn)
    busy: bool = False  # a request is in flight (a second one answers 409)
    one_off: bool = False  # no session id was given: ended after its answer

    @property
    def length(self) -> int:
        """Tokens of the session in the engine (its cache plus the pending last token)."""
        return self.record.length

    def use(self, api: Literal["chat", "completions"]) -> None:
        if self.api is not None and self.api != api:
            raise bad_request("session_id", f"session {self.record.session_id!r} is a {self.api} session")
        self.api = api


def chat_feed(state: SessionState, messages: list[ChatMessage]) -> tuple[list[int], list[tuple[str, str]]]:
    """(ids to feed, the full history) for a chat request on `state`; 400 naming `messages` when it does not
    extend the session's conversation or a message cannot be encoded."""
    seen = state.messages
    got: list[tuple[str, str]] = [(m.role, m.content) for m in messages]
    if len(got) <= len(seen) or got[: len(seen)] != seen:
        raise bad_request(
            "messages",
            f"messages must extend session {state.record.session_id!r}: resend its {len(seen)} earlier messages "
            "exactly (the assistant's replies as returned), then at least one new message",
        )
    try:
        ids = render(messages[len(seen) :], first_index=len(seen))
    except TemplateError as exc:
        raise bad_request(f"messages.{exc.index}.{exc.field}", str(exc)) from None
    if state.length and not state.last_stopped:
        ids = [STOP, *ids]  # the previous turn stopped at max_tokens: close it as the template does
    return ids, got


def completion_feed(state: SessionState, prompt: str) -> list[int]:
    if not prompt.startswith(state.text):
        raise bad_request(
            "prompt", f"prompt must start with session {state.record.session_id!r}'s text so far (prompt + completion)"
        )
    try:
        ids = encode(prompt[len(state.text) :])
    except EncodeError as exc:
        raise bad_request("prompt", str(exc)) from None
    if not ids and not state.length:
        raise bad_request("prompt", "prompt must not be empty")
    return ids


def max_new_tokens(state: SessionState, feed: list[int], requested: int | None, block_size: int, param: str) -> int:
    """Tokens to sample: `requested`, or all the context leaves; 400 naming `param` when the context is too long
    (the engine keeps the last sampled token pending, outside the cache: hence the + 1)."""
    room = block_size - state.length - len(feed) + 1
    if room < 1 or (requested is not None and requested > room):
        want = requested or 1
        raise bad_request(
            param,
            f"context of {state.length + len(feed)} tokens plus {want} to generate exceeds the model's "
            f"{block_size} tokens",
        )
    return requested or room


def _stopped(segment: Segment) -> bool:
    """The segment ended with its stop token (kept in its ids, not in the text the client sees)."""
    ids = segment.completion_ids
    return bool(ids) and ids[-1] == STOP and segment.finish_reason != "length"


def _text(segment: Segment) -> str:
    ids = segment.completion_ids
    return decode(ids[:-1] if _stopped(segment) else ids)


def record_choices(state: SessionState, segments: list[Segment]) -> list[str]:
    """Record a request's n choices (the session's first and only request); returns each choice's text."""
    state.record.segments.extend(segments)
    return [_text(s) for s in segments]


def record_answer(state: SessionState, segment: Segment, history: list[tuple[str, str]] | None, prompt: str) -> str:
    """Record the segment and what the client saw; returns the answer's text (without its stop token)."""
    state.record.segments.append(segment)
    text = _text(segment)
    state.last_stopped = _stopped(segment)
    if history is not None:
        state.messages = [*history, ("assistant", text)]
    else:
        state.text = prompt + text
    return text
