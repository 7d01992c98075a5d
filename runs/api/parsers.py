"""The API's one request parser: JSON that PostgreSQL can store and Python can walk, or a 400 naming the field.

DRF's JSONParser lets through what later fails as a 500: nesting deep enough to exhaust the recursion limit
(`[` x 100,000, even on the unauthenticated token endpoint), lone UTF-16 surrogates ("\\ud800", which psycopg
cannot encode) and NUL characters (PostgreSQL refuses them in text and jsonb). Every API view parses with this
(settings.REST_FRAMEWORK DEFAULT_PARSER_CLASSES); a refused body answers `{"detail", "field"}` with the field's
dotted path (`config.prompt`, `[0].data.msg`), or `body` for the body as a whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

# Deeper than any config, event or settings body the platform accepts; far below the recursion limit.
MAX_DEPTH = 64
_BAD_CHARS = re.compile("[\ud800-\udfff\x00]")


def _refuse(message: str, field: str) -> ParseError:
    return ParseError(detail={"detail": f"{field}: {message}", "field": field})


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _child(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def json_check(value: Any) -> None:
    """Walk a decoded body without recursion: depth at most MAX_DEPTH, no lone surrogate or NUL in any string."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            if _BAD_CHARS.search(item):
                raise _refuse("must not contain NUL characters or unpaired UTF-16 surrogates", path or "body")
        elif isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                raise _refuse(f"nested deeper than {MAX_DEPTH} levels", "body")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str) and _BAD_CHARS.search(key):
                    raise _refuse("a key contains NUL characters or unpaired UTF-16 surrogates", path or "body")
                stack.append((child, _child(path, key), depth + 1))


class SafeJSONParser(JSONParser):
    """application/json, strict (no NaN/Infinity), checked by json_check."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _refuse(f"not UTF-8 ({exc.reason} at byte {exc.start})", "body") from exc
        try:
            data = json.loads(text, parse_constant=_no_constant)
        except RecursionError as exc:
            raise _refuse(f"nested deeper than {MAX_DEPTH} levels", "body") from exc
        except ValueError as exc:
            raise _refuse(f"not valid JSON ({exc})", "body") from exc
        json_check(data)
        return data
