"""Registry of run kinds: what a run's config must look like and how a granted run is launched and stopped.

The RL training kind `rl_train` is registered here; its config is `trainer.config.TrainConfig` (imported
lazily so the web process does not load the trainer until it validates a config). The execution layer
attaches launchers (`kind_attach`) and may register more kinds (`kind_register`).
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runs.errors import InvalidInput

if TYPE_CHECKING:
    from runs.models import Run

DEFAULT_KIND = "rl_train"

ConfigValidator = Callable[[dict[str, Any]], dict[str, Any]]
RunHook = Callable[["Run"], None]
ConfigAuthorizer = Callable[[dict[str, Any], Any], None]


@dataclass(frozen=True)
class RunKind:
    """`validate_config` returns the config to store or raises InvalidInput naming the field (`config.<key>`);
    `launch` starts a granted run (must be idempotent: it can be called again after a lost launch);
    `stop` asks a running job to stop (the run is `stopping` or already failed by the platform);
    `authorize(config, owner)`, if set, raises InvalidInput when the config refers to something the owner may
    not see (answered exactly like a missing thing, so it reveals nothing)."""

    name: str
    validate_config: ConfigValidator
    json_schema: Callable[[], dict[str, Any]]
    description: str = ""
    launch: RunHook | None = None
    stop: RunHook | None = None
    authorize: ConfigAuthorizer | None = None


_lock = threading.Lock()
_kinds: dict[str, RunKind] = {}


def kind_register(kind: RunKind) -> None:
    """Add or replace a kind (replacing keeps hooks already attached unless the new kind brings its own)."""
    with _lock:
        old = _kinds.get(kind.name)
        if old is not None:
            kind = dataclasses.replace(kind, launch=kind.launch or old.launch, stop=kind.stop or old.stop)
        _kinds[kind.name] = kind


def kind_attach(name: str, *, launch: RunHook | None = None, stop: RunHook | None = None) -> None:
    """Attach execution hooks to a registered kind (the execution layer calls this at startup)."""
    with _lock:
        kind = kind_get(name)
        _kinds[name] = dataclasses.replace(kind, launch=launch or kind.launch, stop=stop or kind.stop)


def kind_unregister(name: str) -> None:
    with _lock:
        _kinds.pop(name, None)


def kind_get(name: Any) -> RunKind:
    kind = _kinds.get(name) if isinstance(name, str) else None
    if kind is None:
        raise InvalidInput(f"unknown run kind {name!r}; registered kinds: {', '.join(sorted(_kinds))}", field="kind")
    return kind


def kinds_all() -> list[RunKind]:
    return sorted(_kinds.values(), key=lambda k: k.name)


def _train_config_module() -> Any:
    try:
        from trainer import config
    except ImportError as exc:  # the trainer package ships the schema; without it we cannot validate
        raise InvalidInput(f"the {DEFAULT_KIND} kind needs trainer.config ({exc})", field="kind") from exc
    return config


def _rl_train_validate(config: dict[str, Any]) -> dict[str, Any]:
    """TrainConfig's checks (types, bounds, parameter budget) plus the platform's sandbox: no debug phase and no
    `batch_path`, so nothing in a submitted config names a file (checkpoint and config paths are per run id)."""
    module = _train_config_module()
    if not isinstance(config, dict):
        raise InvalidInput("must be a JSON object", field="config")
    try:
        module.TrainConfig.from_dict(config, allow_debug=False)
    except module.ConfigError as exc:
        field = getattr(exc, "field", "") or ""
        message = str(exc)
        if field and message.startswith(f"{field}: "):  # ConfigError's text already leads with the field
            message = message[len(field) + 2:]
        raise InvalidInput(message, field=f"config.{field}" if field else "config") from exc
    return config


def _rl_train_schema() -> dict[str, Any]:
    return _train_config_module().TrainConfig.json_schema(allow_debug=False)


kind_register(
    RunKind(
        name=DEFAULT_KIND,
        validate_config=_rl_train_validate,
        json_schema=_rl_train_schema,
        description="RL training of a policy with the asynchronous rollout/train loop (trainer.config.TrainConfig)",
    )
)
