"""The message types are declared once (runs/messages.py, trainer/events.py); the dashboard's TypeScript
twin is generated from them and must be current, and what the server sends has the declared keys."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import get_type_hints

from runs import messages, messages_ts
from trainer.events import Event, StoredEvent

ROOT = Path(__file__).resolve().parents[2]
TS_FILE = ROOT / "frontend" / "static" / "src" / "lib" / "messages.ts"


def test_checked_in_typescript_matches_the_python_declarations():
    assert TS_FILE.read_text() == messages_ts.generate(), (
        "frontend/static/src/lib/messages.ts is stale: run `python -m runs.messages_ts > "
        "frontend/static/src/lib/messages.ts`"
    )


def test_every_exported_message_is_in_the_typescript():
    text = TS_FILE.read_text()
    for td in messages.TS_EXPORTS:
        assert f"export interface {td.__name__} {{" in text
        for name in get_type_hints(td):
            assert f"  {name}" in text


def test_message_modules_import_without_django():
    code = (
        "import sys, runs.messages, runs.messages_ts, trainer.events; "
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
