"""The run kinds, a static registry (`KINDS`, built once below): what a kind's config must look like, who may
submit it (`authorize`), what it asks the cluster for (`demand`, pure) and the job that runs it (`job_spec`,
pure). The launcher runs every kind the same way.

`rl_train`'s config is `trainer.config.TrainConfig` (imported when first needed, so the web process does not
load the trainer until it validates a config); `eval` measures a finished training run's last checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runs.core.visibility import visible_runs
from runs.errors import InvalidInput
from runs.execution.jobs import JobSpec, eval_job, rl_train_job
from runs.models import Run

DEFAULT_KIND = "rl_train"
EVAL_KIND = "eval"


@dataclass(frozen=True)
class RunKind:
    """`validate_config` returns the config to store or raises InvalidInput naming the field (`config.<key>`);
    `job_spec(run)` is what the launcher submits for a granted run (None: the kind cannot be launched);
    `authorize(config, owner)`, if set, raises InvalidInput when the config refers to something the owner may
    not see (answered exactly like a missing thing, so it reveals nothing); `demand(config)` is the resources
    a run of a validated config asks for (trainer.resources.demand_json: bundles, total, strategy), stored as
    Run.resources at submit and charged by the grant (default: no processes, nothing)."""

    name: str
    validate_config: Callable[[dict[str, Any]], dict[str, Any]]
    json_schema: Callable[[], dict[str, Any]]
    description: str = ""
    job_spec: Callable[[Run], JobSpec] | None = None
    authorize: Callable[[dict[str, Any], Any], None] | None = None
    demand: Callable[[dict[str, Any]], dict[str, Any]] = lambda config: no_demand()


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
            message = message[len(field) + 2 :]
        raise InvalidInput(message, field=f"config.{field}" if field else "config") from exc
    environment = config.get("environment") or ""
    if environment:
        _check_environment(environment)
    return config


def _check_environment(name: str) -> None:
    """An agent environment must be built in, installed, or a module:Class path staff allowed
    (AGENT_ENVIRONMENTS_ALLOWED): nothing else is ever imported for a run (docs/agents.md)."""
    from django.conf import settings

    from agents.environments import UnknownEnvironment, resolve

    try:
        resolve(name, allowed=getattr(settings, "AGENT_ENVIRONMENTS_ALLOWED", ()))
    except UnknownEnvironment as exc:
        raise InvalidInput(str(exc), field="config.environment") from exc


def _rl_train_schema() -> dict[str, Any]:
    return _train_config_module().TrainConfig.json_schema(allow_debug=False)


def no_demand() -> dict[str, Any]:
    """What a kind that declares no processes asks for: nothing (it fits any cluster)."""
    from trainer.resources import demand_json

    return demand_json([], "PACK")


def rl_train_demand(config: dict[str, Any]) -> dict[str, Any]:
    """Driver, learner, channel, engines and workers (trainer.resources.run_bundles) with the config's strategy."""
    from trainer.resources import demand_json, run_bundles

    cfg = _train_config_module().TrainConfig.from_dict(config, allow_debug=False)
    return demand_json(run_bundles(cfg), cfg.placement_strategy)


def eval_demand(config: dict[str, Any]) -> dict[str, Any]:
    """One process: the evaluation driver."""
    from trainer.resources import demand_json, eval_bundles

    return demand_json(eval_bundles(), "PACK")


EVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["source_run"],
    "properties": {
        "source_run": {
            "type": "integer",
            "minimum": 1,
            "description": "Id of the rl_train run whose last checkpoint is evaluated.",
        },
    },
}


def eval_config_validate(config: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(config) - set(EVAL_SCHEMA["properties"]))
    if unknown:
        raise InvalidInput(f"unknown key(s) {unknown}; allowed: ['source_run']", field=f"config.{unknown[0]}")
    source = config.get("source_run")
    if not isinstance(source, int) or isinstance(source, bool) or source < 1:
        raise InvalidInput("must be the id (a positive integer) of an rl_train run", field="config.source_run")
    return {"source_run": source}  # that it exists and may be seen: eval_authorize, which knows the owner


def eval_authorize(config: dict[str, Any], owner: Any) -> None:
    """The source run must be an rl_train run the owner may see (own runs; staff: all). One query either way,
    so another user's run is answered exactly like a missing one (same 400, same message, same work)."""
    source = config["source_run"]
    if not visible_runs(owner, Run.objects.filter(pk=source, kind=DEFAULT_KIND)).exists():
        raise InvalidInput(f"no {DEFAULT_KIND} run with id {source}", field="config.source_run")


KINDS: dict[str, RunKind] = {
    DEFAULT_KIND: RunKind(
        name=DEFAULT_KIND,
        validate_config=_rl_train_validate,
        json_schema=_rl_train_schema,
        demand=rl_train_demand,
        job_spec=rl_train_job,
        description="RL training of a policy with the asynchronous rollout/train loop (trainer.config.TrainConfig)",
    ),
    EVAL_KIND: RunKind(
        name=EVAL_KIND,
        validate_config=eval_config_validate,
        json_schema=lambda: EVAL_SCHEMA,
        demand=eval_demand,
        job_spec=eval_job,
        authorize=eval_authorize,
        description="Held-out evaluation of an rl_train run's last checkpoint (python -m trainer eval)",
    ),
}


def kind_get(name: Any) -> RunKind:
    kind = KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise InvalidInput(f"unknown run kind {name!r}; registered kinds: {', '.join(sorted(KINDS))}", field="kind")
    return kind


def kinds_all() -> list[RunKind]:
    return sorted(KINDS.values(), key=lambda k: k.name)
