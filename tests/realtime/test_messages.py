"""The message types are declared once (runs/messages.py, runs/summary_types.py, trainer/events.py and the
trainer's event data models); the dashboard's TypeScript twin is generated from them and must be current, and
what the server sends has the declared keys."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import get_type_hints

import pytest
from pydantic import BaseModel, create_model

from runs import messages, summary_types
from runs.core.events import STATUS, stored_type
from runs.preempt_messages import PREEMPT_EVENT_TYPES
from runs.telemetry import messages_ts
from runs.telemetry.ts_types import annotated_model, models_in, ts_interface
from trainer.event_schema import DATA_MODELS, declared_keys
from trainer.events import EVENT_TYPES, Event, StoredEvent
from trainer.step_schema import TrainData

ROOT = Path(__file__).resolve().parents[2]
TS_FILE = ROOT / "frontend" / "static" / "src" / "lib" / "messages.ts"


def test_checked_in_typescript_matches_the_python_declarations():
    assert TS_FILE.read_text() == messages_ts.generate(), (
        "frontend/static/src/lib/messages.ts is stale: run `python -m runs.telemetry.messages_ts > "
        "frontend/static/src/lib/messages.ts`"
    )


def ts_fields(text: str, name: str) -> dict[str, bool]:
    """The fields of `export interface <name>` in the TypeScript: {field: may be absent}."""
    block = re.search(rf"^export interface {name} \{{\n(.*?)^\}}", text, re.S | re.M)
    assert block, f"{name} is not in frontend/static/src/lib/messages.ts"
    return {m[1]: m[2] == "?" for m in re.finditer(r"^  (\w+)(\??): ", block[1], re.M)}


def model_gaps(model: type[BaseModel], text: str) -> list[str]:
    """Fields of a trainer event model that the TypeScript lacks, or declares with the other optionality."""
    have = ts_fields(text, model.__name__)
    return [n for n, info in model.model_fields.items() if have.get(n) != (not info.is_required())]


def test_every_exported_message_is_in_the_typescript():
    text = TS_FILE.read_text()
    for td in messages_ts.TS_EXPORTS:
        assert set(ts_fields(text, td.__name__)) == set(get_type_hints(td))


@pytest.mark.parametrize("etype", sorted(messages_ts.STREAM_DATA))
def test_every_field_of_every_trainer_event_model_is_in_the_typescript(etype):
    text = TS_FILE.read_text()
    for model in models_in(messages_ts.STREAM_DATA[etype]):  # the data model and the models nested in it
        assert model_gaps(model, text) == [], (
            f"{model.__name__}: run python -m runs.telemetry.messages_ts > lib/messages.ts"
        )


def test_a_field_added_to_a_trainer_model_is_missing_from_the_typescript_until_it_is_generated():
    wider = create_model("TrainData", __base__=TrainData, grad_scale=(float | None, None))
    text = TS_FILE.read_text()
    assert model_gaps(wider, text) == ["grad_scale"]
    assert ts_interface(wider) not in text and ts_interface(TrainData) in text


def test_the_stream_union_has_one_member_per_stored_event_type():
    posted = EVENT_TYPES - {"sample"}  # samples go to their own table
    platform = {STATUS, *PREEMPT_EVENT_TYPES}  # the platform's own: its moves, its preemptions
    assert set(messages_ts.STREAM_DATA) == {stored_type(etype) for etype in posted} | platform
    assert not set(PREEMPT_EVENT_TYPES) & EVENT_TYPES  # a job can never post one
    assert messages_ts.STREAM_DATA[STATUS] is messages.StatusMoveData  # the platform's moves
    assert messages_ts.STREAM_DATA[stored_type(STATUS)] is DATA_MODELS[STATUS]  # the job's reports
    text = TS_FILE.read_text()
    assert ts_fields(text, "EventData") == dict.fromkeys(messages_ts.STREAM_DATA, False)
    for etype in messages_ts.STREAM_DATA:
        assert f'  | StoredEventOf<"{etype}">' in text
    assert set(ts_fields(text, "StoredEventOf<T extends EventType>")) == set(get_type_hints(StoredEvent))


def test_a_status_event_data_is_built_from_one_declaration_in_python_and_in_sql():
    keys = list(messages.StatusMoveData.__annotations__)
    built = messages.status_move_data(status="running", previous="starting", error="")
    assert list(built) == keys
    sql = messages.status_move_data_sql(status="%(status)s::text", previous="previous", error="error")
    assert sql == "jsonb_build_object('status', %(status)s::text, 'previous', previous, 'error', error)"
    assert re.findall(r"'(\w+)', ", sql) == keys
    with pytest.raises(ValueError, match="needs exactly"):  # a key of the TypedDict left out of the statement
        messages.status_move_data_sql(status="%(status)s::text", previous="previous")


def test_the_summary_keeps_each_summarized_type_as_its_event_model():
    hints = get_type_hints(summary_types.RunSummary, include_extras=True)
    models = {key: annotated_model(tp) for key, tp in hints.items() if annotated_model(tp) is not None}
    assert models == {etype: DATA_MODELS[etype] for etype in summary_types.SUMMARY_TYPES}
    assert set(summary_types.BoardSampler.__annotations__) == declared_keys("sampler")


def test_message_modules_import_without_django():
    code = (
        "import sys, runs.messages, runs.telemetry.messages_ts, runs.summary_types, trainer.events; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework', 'channels')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_emitter_event_has_the_stored_event_fields():
    event = Event(seq=1, type="log", data={"text": "x"}, ts=1.0, run=7).to_dict()
    assert set(event) == set(get_type_hints(StoredEvent))


def test_nothing_in_runs_imports_the_api_layer():
    import ast

    offenders = []
    for path in (ROOT / "runs").rglob("*.py"):
        if "api" in path.relative_to(ROOT / "runs").parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            offenders += [
                f"{path.relative_to(ROOT)}: {n}" for n in names if n == "runs.api" or n.startswith("runs.api.")
            ]
    assert offenders == []
