"""How TrainConfig meets JSON: `ConfigError`, strict coercion of one decoded JSON value to a field's type
(`coerce`), the field docstrings read from the source (`field_docs`) and the JSON schema built from the fields,
their bounds and docstrings (`build_schema`). The fields, bounds and budget themselves are `trainer.config`'s.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import textwrap
import typing
from functools import cache
from typing import Any, Literal


class ConfigError(ValueError):
    """A config value that is missing, unknown, of the wrong type or out of range; `.field` names the key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def build_schema(
    cls: type, bounds: dict[str, tuple[float | None, float | None]], parameter_budget: int, *, allow_debug: bool
) -> dict[str, Any]:
    """TrainConfig.json_schema: every field of dataclass `cls` with its type, default, docstring and `bounds`."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    props: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        prop = type_schema(hints[f.name])
        prop.update(default=f.default, description=docs.get(f.name, ""))
        lo, hi = bounds.get(f.name, (None, None))
        if lo is not None:
            prop["minimum"] = lo
        if hi is not None:
            prop["maximum"] = hi
        props[f.name] = prop
    if not allow_debug:
        props["phase"]["enum"] = ["full"]
        props["batch_path"]["maxLength"] = 0
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "TrainConfig",
        "description": (
            "Configuration of an RL training run (run kind rl_train). The policy may have at most "
            f"{parameter_budget:,} parameters (embeddings, n_layer blocks of width d_model, "
            "head); the platform accepts only phase 'full' and an empty batch_path."
        ),
        "x-parameter-budget": parameter_budget,
        "type": "object",
        "properties": props,
        "additionalProperties": False,
    }


def coerce(key: str, hint: Any, value: Any) -> Any:
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if value not in choices or not isinstance(value, str):
            raise ConfigError(key, f"expected one of {list(choices)}, got {value!r}")
        return value
    # bool is a subclass of int in Python but never a valid number here.
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected a number, got {value!r}")
        if not math.isfinite(value):  # NaN would pass every bound check
            raise ConfigError(key, f"expected a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    raise ConfigError(key, f"unsupported field type {hint!r}")


def type_schema(hint: Any) -> dict[str, Any]:
    if typing.get_origin(hint) is Literal:
        return {"type": "string", "enum": list(typing.get_args(hint))}
    return {bool: {"type": "boolean"}, int: {"type": "integer"}, float: {"type": "number"}, str: {"type": "string"}}[
        hint
    ]


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass `cls`, read from the source (the one place they are written)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = nxt.value.value.strip()
    return docs
