"""The OpenAI response bodies the session server answers with: chat.completion, text_completion, their
streaming chunks (server-sent events ending with `data: [DONE]`) and the model list. Besides the OpenAI
fields every answer carries `session_id` and `rl` {request_id, engine, version, versions, token_ids} (clients
ignore unknown fields; the run page's chat shows each token's version from them)."""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from agents.chat import STOP, decode
from agents.trajectory import Segment


def model_id(run: str, version: int) -> str:
    return f"{run}@v{version}"


def models(run: str, version: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model_id(run, version), "object": "model", "created": 0, "owned_by": "rl-control-plane"}],
    }


def answer(
    chat: bool, run: str, session_id: str, segments: list[Segment], texts: list[str], logprobs: bool
) -> dict[str, Any]:
    """One body for a request's choices (one segment and text each); `rl` is the first choice's, and with n > 1
    each choice carries its own `rl` {token_ids, versions}."""
    first = segments[0]
    version = first.versions[0] if first.versions else 0
    choices = [_choice(chat, s, text, logprobs, len(segments) > 1) for s, text in zip(segments, texts)]
    prompt, completion = len(first.prompt_ids), sum(len(s.completion_ids) for s in segments)
    return {
        "id": ("chatcmpl-" if chat else "cmpl-") + first.request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model_id(run, version),
        "choices": choices,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        "session_id": session_id,
        "rl": {
            "request_id": first.request_id,
            "engine": first.engine,
            "version": version,
            "versions": first.versions,
            "token_ids": first.completion_ids,
        },
    }


def _choice(chat: bool, s: Segment, text: str, logprobs: bool, own_rl: bool) -> dict[str, Any]:
    finish = "length" if s.finish_reason == "length" else "stop"
    pieces = [decode([t]) for t in s.completion_ids]
    choice: dict[str, Any] = {"index": s.choice, "finish_reason": finish, "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
        if logprobs:
            choice["logprobs"] = {
                "content": [
                    {"token": p, "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
                    for p, lp in zip(pieces, s.logprobs)
                ]
            }
    else:
        choice["text"] = text
        if logprobs:
            choice["logprobs"] = {"tokens": pieces, "token_logprobs": s.logprobs, "top_logprobs": None}
    if own_rl:
        choice["rl"] = {"token_ids": s.completion_ids, "versions": s.versions}
    return choice


async def open_stream(request: web.Request) -> web.StreamResponse:
    """Send the event-stream headers (and a comment line) before generation starts."""
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await stream.prepare(request)
    await stream.write(b": generating\n\n")
    return stream


async def finish_stream(stream: web.StreamResponse, body: dict[str, Any]) -> None:
    """The answer as chunks: (chat: a role chunk) one chunk per token, a final chunk with finish_reason, [DONE]."""
    chat = body["object"] == "chat.completion"
    choice = body["choices"][0]
    ids = body["rl"]["token_ids"]
    shown = ids[:-1] if ids and ids[-1] == STOP and choice["finish_reason"] == "stop" else ids
    base = {k: body[k] for k in ("id", "created", "model", "session_id")}
    base["object"] = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta: str | None, finish: str | None, role: bool = False) -> bytes:
        if chat:
            d: dict[str, Any] = {"role": "assistant", "content": ""} if role else ({"content": delta} if delta else {})
            c: dict[str, Any] = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
        else:
            c = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
        extra = {"rl": body["rl"], "usage": body["usage"]} if finish else {}
        return b"data: " + json.dumps({**base, "choices": [c], **extra}).encode() + b"\n\n"

    parts = [chunk(None, None, role=True)] if chat else []
    parts += [chunk(decode([t]), None) for t in shown]
    parts.append(chunk(None, choice["finish_reason"]))
    await stream.write(b"".join(parts) + b"data: [DONE]\n\n")
    await stream.write_eof()


async def stream_error(stream: web.StreamResponse, error: dict[str, Any]) -> None:
    """An error after the stream's 200 was sent: one `error` event (the openai client raises it), then the end."""
    try:
        await stream.write(b"data: " + json.dumps(error).encode() + b"\n\n")
        await stream.write_eof()
    except (ConnectionError, RuntimeError):
        pass  # the client is gone as well
