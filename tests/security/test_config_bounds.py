"""Run configs cannot ask for unbounded work (issue 9, point 2a; the sandbox of point 1 is in
test_config_sandbox.py).

Through the REST API (`POST /api/runs/`): every work-scaling field has a maximum (just over it is a 400 naming
`config.<field>`, the maximum itself is accepted), and the policy has a parameter budget. The parameter count is
that of the policy that would be built, and the defaults and bench/ configs fit the bounds.
"""

from __future__ import annotations

import json

import pytest

from runs.models import Run
from tests.runs.helpers import (  # noqa: F401 - fixtures
    _fast_password_hashing,
    _fresh_policy_cache,
    handoffs,
    other_user,
    user,
)
from tests.security.config_submit import ROOT, assert_refused, submit

# The maxima a small RL run on a cluster needs (defaults and bench/ configs stay inside them).
MAXIMA = {
    "steps": 10_000,
    "prompts_per_step": 512,
    "group_size": 64,
    "eval_prompts": 1024,
    "num_engines": 16,
    "num_workers": 16,
    "worker_capacity": 256,
    "eval_every": 10_000,
    "checkpoint_every": 10_000,
    "time_limit_s": 86_400.0,
    "publish_deadline_s": 600.0,
    "max_staleness": 16,
    "modulus": 100,
    "ppo_epochs": 16,
    "min_valid_attempts": 64,
    "n_layer": 24,
    "d_model": 1024,
    "tool_latency_s": 60.0,
    "context_tokens": 4096,
}
# What a field's maximum needs from the others to be valid on its own (min_valid_attempts <= group_size; a
# d_model of 1024 fits the parameter budget with one block; n_layer 24 with the default width).
COMPANIONS = {"min_valid_attempts": {"group_size": 64}, "d_model": {"n_layer": 1}}
PARAMETER_BUDGET = 25_000_000


def _over(value):
    return value + 1 if isinstance(value, int) else value + 0.5


@pytest.mark.django_db
@pytest.mark.parametrize("field", sorted(MAXIMA))
def test_just_over_the_maximum_is_400_naming_the_field(user, handoffs, field):
    assert_refused(submit(user, {**COMPANIONS.get(field, {}), field: _over(MAXIMA[field])}), f"config.{field}")
    assert not Run.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("field", sorted(MAXIMA))
def test_the_maximum_itself_is_accepted(user, handoffs, field):
    answer = submit(user, {**COMPANIONS.get(field, {}), field: MAXIMA[field]})
    assert answer.status_code == 201, answer.content


@pytest.mark.django_db
def test_schema_shows_every_maximum_and_the_budget(user):
    from runs.execution.kinds import kind_get

    schema = kind_get("rl_train").json_schema()
    assert {f: schema["properties"][f].get("maximum") for f in MAXIMA} == MAXIMA
    assert schema["x-parameter-budget"] == PARAMETER_BUDGET and f"{PARAMETER_BUDGET:,}" in schema["description"]


@pytest.mark.django_db
def test_model_over_the_parameter_budget_is_400_naming_the_budget(user, handoffs):
    # 2 blocks of width 1024 (~25.2M parameters): each bound alone holds, the budget does not.
    answer = submit(user, {"n_layer": 2, "d_model": 1024})
    assert_refused(answer, "config.d_model")
    assert f"{PARAMETER_BUDGET:,}" in answer.json()["detail"]
    assert_refused(submit(user, {"n_layer": 24, "d_model": 512}), "config.d_model")
    assert submit(user, {"n_layer": 8, "d_model": 448}).status_code == 201  # ~19.4M


def test_parameter_count_is_the_policy_that_would_be_built():
    from trainer.config import TrainConfig, policy_parameters
    from trainer.policy import build_policy
    from trainer.problems import policy_shape

    for cfg in (
        TrainConfig(),
        TrainConfig(task="agent", n_layer=3, d_model=96, modulus=100, answer_terms=7, prompt_terms_max=9),
        TrainConfig(environment="chat", context_tokens=300),  # an agent environment: the chat vocabulary
    ):
        model = build_policy(cfg, *policy_shape(cfg))
        assert policy_parameters(cfg) == sum(p.numel() for p in model.parameters())


def test_defaults_and_bench_configs_fit_the_bounds():
    from trainer.config import TrainConfig

    TrainConfig.from_dict(json.loads((ROOT / "trainer" / "defaults.json").read_text()), allow_debug=False)
    results = ROOT / "bench" / "results"
    TrainConfig.from_dict(json.loads((results / "learning.json").read_text())["config"], allow_debug=False)
    runs = json.loads((results / "async.json").read_text())  # one config, run at each tool latency
    for part in runs["tool_latency_ms"].values():
        TrainConfig.from_dict({**runs["config"], "tool_latency_s": part["tool_latency_s"]}, allow_debug=False)
