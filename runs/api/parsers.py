"""The API's one request parser: bounded JSON that PostgreSQL can store and Python can walk, or a refusal.

DRF's JSONParser lets through what later fails as a 500 or fills the web process's memory: nesting deep enough
to exhaust the recursion limit (`[` x 100,000, even on the unauthenticated token endpoint), lone UTF-16
surrogates ("\\ud800", which psycopg cannot encode), NUL characters (PostgreSQL refuses them in text and jsonb),
and bodies whose decoded form is many times their size. Every API view parses with this
(settings.REST_FRAMEWORK DEFAULT_PARSER_CLASSES), in this order, each step bounded by the one before:

1. size: at most the path's body cap (settings.BODY_LIMITS, else MAX_BODY_BYTES) is read; past it, 413
   `{"detail", "limit"}` (the ASGI app, config/body_limit.py, refuses such bodies before Django reads them);
2. values: counted on the raw bytes before anything is decoded (JSON_MAX_NODES), so no body builds more objects
   than that;
3. decode, then walk the result without recursion and without building paths (json_check): depth, key and
   string lengths, items per list or object, no lone surrogate or NUL.

A refusal of 2 or 3 answers 400 `{"detail", "field"}` with the field's dotted path (`config.prompt`,
`[0].data.msg`), or `body` for the body as a whole; the path is built only for the value refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from rest_framework.exceptions import APIException, ErrorDetail, ParseError
from rest_framework.parsers import JSONParser

# Deeper than any config, event or settings body the platform accepts; far below the recursion limit.
MAX_DEPTH = 64
_BAD_CHARS = re.compile("[\ud800-\udfff\x00]")
# A JSON string, to its closing quote or to the end of an unterminated one (possessive, so linear whatever the
# input): what the value count skips.
_STRING = re.compile(rb'"[^"\\]*+(?:\\[\s\S][^"\\]*+)*+(?:"|\\?\Z)')


@dataclass(frozen=True)
class JsonLimits:
    """What a decoded body may hold (config/security.py: JSON_MAX_*; docs/security.md, "Size limits")."""

    key_chars: int = 256
    string_chars: int = 64 * 1024
    items: int = 10_000
    nodes: int = 50_000
    depth: int = MAX_DEPTH

    @classmethod
    def from_settings(cls) -> JsonLimits:
        return cls(
            key_chars=getattr(settings, "JSON_MAX_KEY_CHARS", cls.key_chars),
            string_chars=getattr(settings, "JSON_MAX_STRING_CHARS", cls.string_chars),
            items=getattr(settings, "JSON_MAX_ITEMS", cls.items),
            nodes=getattr(settings, "JSON_MAX_NODES", cls.nodes),
        )


class BodyTooLarge(APIException):
    """413 `{"detail", "limit"}`: the body is over its cap (the limit stays an integer in the JSON)."""

    status_code = 413
    default_code = "too_large"

    def __init__(self, limit: int) -> None:
        super().__init__()
        detail: dict[str, Any] = {
            "detail": ErrorDetail(f"body: larger than the limit of {limit} bytes", code=self.default_code),
            "limit": limit,
        }
        self.detail = detail


def body_limit(path: str) -> int:
    """The body cap of a request path: the first of settings.BODY_LIMITS whose regex matches it, else
    MAX_BODY_BYTES (config/body_limit.py applies the same rule in the ASGI app)."""
    for pattern, limit in getattr(settings, "BODY_LIMITS", ()):
        if re.fullmatch(pattern, path):
            return int(limit)
    return int(getattr(settings, "MAX_BODY_BYTES", 1024 * 1024))


def _structure(raw: bytes, start: int, end: int) -> int:
    return raw.count(b",", start, end) + raw.count(b"[", start, end) + raw.count(b"{", start, end)


def json_values_over(raw: bytes, most: int) -> bool:
    """Whether a JSON text holds more than `most` values, counted on its bytes before anything is decoded: one,
    plus one per `,`, `[` and `{` outside strings (so an empty list or object counts once more than it holds).
    No copy of the text is made: when the count with the characters inside strings is within `most`, so is the
    count without them; else strings are skipped one by one until the count passes `most` or the text ends."""
    if 1 + _structure(raw, 0, len(raw)) <= most:
        return False
    count, after = 1, 0
    for string in _STRING.finditer(raw):
        count += _structure(raw, after, string.start())
        if count > most:
            return True
        after = string.end()
    return count + _structure(raw, after, len(raw)) > most


def _refuse(message: str, field: str) -> ParseError:
    return ParseError(detail={"detail": f"{field}: {message}", "field": field})


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _path(trail: tuple[Any, ...]) -> str:
    """The dotted path of a value from the keys and indexes that lead to it (`config.prompt`, `[0].data.msg`)."""
    path = ""
    for key in trail:
        path = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key)
    return path or "body"


def _pairs(item: dict | list) -> Iterator[tuple[Any, Any]]:
    return iter(item.items()) if isinstance(item, dict) else enumerate(item)


def _value_problem(item: Any, limits: JsonLimits) -> str | None:
    if isinstance(item, str):
        if len(item) > limits.string_chars:
            return f"longer than {limits.string_chars} characters"
        if _BAD_CHARS.search(item):
            return "must not contain NUL characters or unpaired UTF-16 surrogates"
    elif isinstance(item, (dict, list)) and len(item) > limits.items:
        return f"more than {limits.items} items"
    return None


def _key_problem(key: str, limits: JsonLimits) -> str | None:
    if len(key) > limits.key_chars:
        return f"a key is longer than {limits.key_chars} characters"
    if _BAD_CHARS.search(key):
        return "a key contains NUL characters or unpaired UTF-16 surrogates"
    return None


def json_check(value: Any, limits: JsonLimits | None = None) -> None:
    """Walk a decoded body without recursion and without building paths: depth at most `limits.depth`, keys,
    strings and containers within their limits, no lone surrogate or NUL in any string. The walk keeps one
    iterator per open container and the keys leading to it (at most `depth` of each), so its memory does not
    grow with the number or length of the keys; the path of a refused value is built only to name it."""
    limits = limits or JsonLimits.from_settings()
    problem = _value_problem(value, limits)
    if problem:
        raise _refuse(problem, "body")
    if not isinstance(value, (dict, list)):
        return
    stack: list[tuple[Iterator[tuple[Any, Any]], tuple[Any, ...]]] = [(_pairs(value), ())]
    while stack:
        pairs, trail = stack[-1]
        pair = next(pairs, None)
        if pair is None:
            stack.pop()
            continue
        key, child = pair
        if isinstance(key, str):
            problem = _key_problem(key, limits)
            if problem:
                raise _refuse(problem, _path(trail))
        problem = _value_problem(child, limits)
        if problem:
            raise _refuse(problem, _path((*trail, key)))
        if isinstance(child, (dict, list)):
            if len(stack) >= limits.depth:
                raise _refuse(f"nested deeper than {limits.depth} levels", "body")
            stack.append((_pairs(child), (*trail, key)))


class SafeJSONParser(JSONParser):
    """application/json, strict (no NaN/Infinity), size-capped, value-counted, then checked by json_check."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        request = (parser_context or {}).get("request")
        limit = body_limit(request.path if request is not None else "")
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise BodyTooLarge(limit)
        limits = JsonLimits.from_settings()
        if json_values_over(raw, limits.nodes):
            raise _refuse(f"holds more than {limits.nodes} values", "body")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _refuse(f"not UTF-8 ({exc.reason} at byte {exc.start})", "body") from exc
        del raw
        try:
            data = json.loads(text, parse_constant=_no_constant)
        except RecursionError as exc:
            raise _refuse(f"nested deeper than {MAX_DEPTH} levels", "body") from exc
        except ValueError as exc:
            raise _refuse(f"not valid JSON ({exc})", "body") from exc
        json_check(data, limits)
        return data
