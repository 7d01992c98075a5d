"""Each event type's `data`, declared once: its fields, their types and their bounds (pydantic models, strict:
no coercion, finite numbers only). Shared by the trainer (its emitter checks every event it sends) and the
platform (ingest keeps only what is declared here; the board, compare and trace read only declared fields).

The models are declared by family: a training step's events in trainer/step_schema.py, the run's own in
trainer/lifecycle_schema.py, the `sample` event in trainer/sample_schema.py, all from the bounded field types of
trainer/event_fields.py. Here they are registered by event type (`DATA_MODELS`) and applied:
`data_clean(type, data)` validates and returns the declared fields that were given: unknown fields are dropped,
a wrong type or an over-long string, list or map is refused (EventSchemaError naming the field's path).
Why pydantic: it was already installed (Ray depends on it), it validates in compiled code (a 1,000-event batch
costs milliseconds) and its errors carry the field's location as data, which is what a 400 must name.
docs/realtime.md, "Event schema".
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from trainer.event_fields import NAME_MAX, TEXT_MAX
from trainer.lifecycle_schema import (
    CheckpointData,
    ControlData,
    LogData,
    ResourcesData,
    ServingData,
    StatusData,
    WorkerData,
)
from trainer.sample_schema import SampleModel
from trainer.step_schema import AgentsData, GateData, RolloutData, SamplerData, TrainData, VersionData

DATA_MODELS: dict[str, type[BaseModel]] = {
    "status": StatusData,
    "gate": GateData,
    "version": VersionData,
    "sampler": SamplerData,
    "rollout": RolloutData,
    "train": TrainData,
    "worker": WorkerData,
    "checkpoint": CheckpointData,
    "log": LogData,
    "resources": ResourcesData,
    "sample": SampleModel,
    "control": ControlData,
    "serving": ServingData,
    "agents": AgentsData,
}
# Free-text fields an emitter cuts to TEXT_MAX rather than fail its run on (an exception's text can be long).
TEXT_FIELDS: dict[str, tuple[str, ...]] = {
    "status": ("error",),
    "log": ("message",),
    "worker": ("error",),
    "checkpoint": ("error", "path"),
    "control": ("detail",),
    "resources": ("detail",),
}


def required_keys(etype: str) -> frozenset[str]:
    """The fields of `etype`'s data that every event of it carries."""
    fields = DATA_MODELS[etype].model_fields
    return frozenset(name for name, info in fields.items() if info.is_required())


def declared_keys(etype: str) -> frozenset[str]:
    return frozenset(DATA_MODELS[etype].model_fields)


class DataSchemaError(ValueError):
    """`data` breaks its type's schema: `field` is the path (e.g. `data.engines[3].state`), `reason` why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def data_clean(etype: str, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with only its declared fields (those given); DataSchemaError naming the first bad field."""
    try:
        model = DATA_MODELS[etype].model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        raise DataSchemaError(_path(first["loc"]), first["msg"].removeprefix("Value error, ")) from None
    return model.model_dump(exclude_unset=True)


def data_fit(etype: str, data: dict[str, Any]) -> dict[str, Any]:
    """An emitter's data with its free-text fields cut to TEXT_MAX characters (nothing else changes)."""
    keys = [k for k in TEXT_FIELDS.get(etype, ()) if isinstance(data.get(k), str) and len(data[k]) > TEXT_MAX]
    if not keys:
        return data
    return {**data, **{k: data[k][: TEXT_MAX - 3] + "..." for k in keys}}


def _path(loc: tuple[int | str, ...]) -> str:
    """`data.a[3].b`; map keys are posted text, so each is cut to NAME_MAX characters (`[key]` marks a bad key)."""
    out = "data"
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "[key]":
            out += "." + (part if len(part) <= NAME_MAX else part[:NAME_MAX] + "...")
    return out
