"""How a Python declaration reads in the generated TypeScript (runs/telemetry/ts_types.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, Required, TypedDict

from pydantic import BaseModel

from runs.telemetry.ts_types import models_in, ts_interface, ts_type
from trainer.event_fields import Count, Metrics, Name, SpanModel
from trainer.step_schema import GateData, GateEngine


class Row(TypedDict, total=False):
    """A row."""

    id: Required[int]
    gate: Annotated[dict[str, Any], GateData]
    note: str | None


class Strict(TypedDict):
    id: int
    extra: NotRequired[list[int | float]]


class Nested(BaseModel):
    name: Name
    span: SpanModel | None = None
    counts: dict[Literal["a", "b"], Count]


def test_scalars_unions_lists_and_maps():
    assert ts_type(Any) == "unknown"  # a page checks such a value before it uses it
    assert ts_type(int | float | None) == "number | null"
    assert ts_type(list[str | None]) == "(string | null)[]"
    assert ts_type(dict[str, list[bool]]) == "Record<string, boolean[]>"
    assert ts_type(Literal["open", "sealed"]) == '"open" | "sealed"'
    assert ts_type(Metrics) == "Record<string, number | boolean | string | null>"


def test_a_map_keyed_by_literals_may_lack_keys():
    assert ts_type(dict[Literal["400", "503"], int]) == 'Partial<Record<"400" | "503", number>>'


def test_a_typeddict_key_annotated_with_a_model_is_that_model():
    assert ts_type(Annotated[dict[str, Any], GateData]) == "GateData"
    assert ts_interface(Row) == (
        "/** A row. */\nexport interface Row {\n  id: number;\n  gate?: GateData;\n  note?: string | null;\n}"
    )
    assert ts_interface(Strict) == "export interface Strict {\n  id: number;\n  extra?: number[];\n}"


def test_a_model_field_with_a_default_may_be_absent():
    assert ts_interface(Nested) == (
        "export interface Nested {\n  name: string;\n  span?: SpanModel | null;\n"
        '  counts: Partial<Record<"a" | "b", number>>;\n}'
    )


def test_models_are_found_nested_first_once_per_mention():
    assert list(dict.fromkeys(models_in(Nested))) == [SpanModel, Nested]
    assert list(dict.fromkeys(models_in(Annotated[dict[str, Any], GateData]))) == [GateEngine, GateData]
