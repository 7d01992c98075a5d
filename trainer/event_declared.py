"""The emitter's side of the event schema: a job sends only declared fields.

The platform drops what trainer/event_schema.py does not declare (its ingest keeps the declared fields only), so
a field the trainer emits but the schema forgot would vanish without a word between the job and the run page.
`undeclared_fields` finds such fields; the emitter (trainer/sinks.py) refuses an event that has any, so every
run the test suite makes checks the schema against what the trainer really sends.
"""

from __future__ import annotations

from typing import Any

from trainer.event_schema import data_clean


def undeclared_fields(etype: str, data: dict[str, Any]) -> list[str]:
    """Paths (`data.x`, `data.engines[0].y`) of fields in `data` that its type's schema would drop."""
    return _dropped(data, data_clean(etype, data), "data")


def _dropped(given: Any, kept: Any, path: str) -> list[str]:
    if isinstance(given, dict) and isinstance(kept, dict):
        out: list[str] = []
        for key, value in given.items():
            if key not in kept:
                out.append(f"{path}.{key}")
            else:
                out += _dropped(value, kept[key], f"{path}.{key}")
        return out
    if isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        return [p for i, (g, k) in enumerate(zip(given, kept)) for p in _dropped(g, k, f"{path}[{i}]")]
    return []
