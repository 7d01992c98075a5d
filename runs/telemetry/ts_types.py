"""Python type declarations in TypeScript, for the generated twin of the platform's messages
(runs.telemetry.messages_ts). Django-free.

Two kinds of declaration become a TS interface: a TypedDict (the platform's messages, runs/messages.py) and a
pydantic model (the trainer's event data, trainer/*_schema.py: each field, its annotation, and whether it is
required; a field with a default may be absent, as `model_dump(exclude_unset=True)` leaves it out).
`Annotated[dict[str, Any], Model]` is a dict to mypy and `Model` here: how a TypedDict says that a key holds
a model's JSON. `Any` is `unknown`: a page must check such a value before it uses it.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    Required,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from pydantic import BaseModel


def is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def annotated_model(tp: Any) -> type[BaseModel] | None:
    """The model an `Annotated[..., Model]` names, else None."""
    if get_origin(tp) is not Annotated:
        return None
    return next((m for m in tp.__metadata__ if is_model(m)), None)


def ts_type(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return "unknown"
    if tp is type(None):
        return "null"
    if tp in (int, float):
        return "number"
    if tp is str:
        return "string"
    if tp is bool:
        return "boolean"
    if is_typeddict(tp) or is_model(tp):
        return str(tp.__name__)
    if origin is Annotated:
        model = annotated_model(tp)
        return model.__name__ if model is not None else ts_type(args[0])
    if origin in (Required, NotRequired):
        return ts_type(args[0])
    if origin is Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(dict.fromkeys(ts_type(a) for a in args))  # int | float: one `number`
    if origin is list:
        inner = ts_type(args[0])
        return f"({inner})[]" if "|" in inner else f"{inner}[]"
    if origin is dict:
        record = f"Record<{ts_type(args[0])}, {ts_type(args[1])}>"
        return f"Partial<{record}>" if get_origin(_bare(args[0])) is Literal else record  # not every key is there
    raise TypeError(f"no TypeScript for {tp!r}")


def _bare(tp: Any) -> Any:
    """`tp` without Annotated's metadata."""
    return get_args(tp)[0] if get_origin(tp) is Annotated else tp


def fields(decl: Any) -> list[tuple[str, Any, bool]]:
    """(name, annotation, may be absent) of each field of a TypedDict or a pydantic model, in order."""
    if is_model(decl):
        return [(name, info.annotation, not info.is_required()) for name, info in decl.model_fields.items()]
    # From the hints, not `__optional_keys__`: under `from __future__ import annotations` Python 3.11 does not see
    # a Required/NotRequired written in a string annotation when it builds the class.
    hints = get_type_hints(decl, include_extras=True)
    return [(name, tp, _absent(tp, total=decl.__total__)) for name, tp in hints.items()]


def _absent(tp: Any, *, total: bool) -> bool:
    """Whether a TypedDict key may be absent."""
    origin = get_origin(tp)
    return origin is NotRequired or (not total and origin is not Required)


def ts_interface(decl: Any) -> str:
    """`export interface Name { ... }` of a TypedDict or a pydantic model, with its docstring."""
    doc = " ".join((decl.__doc__ or "").split())
    lines = [f"/** {doc} */"] if doc and not doc.startswith(decl.__name__ + "(") else []
    lines.append(f"export interface {decl.__name__} {{")
    lines += [f"  {name}{'?' if optional else ''}: {ts_type(tp)};" for name, tp, optional in fields(decl)]
    lines.append("}")
    return "\n".join(lines)


def models_in(tp: Any) -> Iterator[type[BaseModel]]:
    """Every pydantic model an annotation names, nested ones first."""
    if is_model(tp):
        for _, field, _ in fields(tp):
            yield from models_in(field)
        yield tp
        return
    if not is_typeddict(tp):  # a TypedDict is declared on its own
        for arg in get_args(tp):  # also Annotated's metadata, where `Annotated[dict[str, Any], Model]` names one
            yield from models_in(arg)
