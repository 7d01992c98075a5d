"""The validated training-run configuration: one dataclass, its JSON schema, and strict dict parsing.

The platform validates `rl_train` run configs with `TrainConfig.from_dict(..., allow_debug=False)` and shows
`TrainConfig.json_schema()`; the CLI parses config files with `TrainConfig.from_dict`; both read the one-line
docstring under each field. Every field that scales work has an upper bound (`_BOUNDS`, shown in the schema),
and the policy's size is capped by a parameter budget (`PARAMETER_BUDGET`, see `policy_parameters`).
This module owns the fields, bounds and budget; coercing JSON values and building the schema is
`trainer.config_schema`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Literal

from trainer.config_schema import ConfigError, build_schema, coerce
from trainer.problems import VOCAB, episode_block_size

__all__ = ["PARAMETER_BUDGET", "ConfigError", "TrainConfig", "policy_parameters"]

TaskName = Literal["digits", "agent"]
Mode = Literal["local", "colocated", "disaggregated"]
Phase = Literal["full", "rollout_only", "train_only"]
Device = Literal["auto", "cpu", "cuda"]
PlacementStrategy = Literal["PACK", "STRICT_PACK", "SPREAD"]


@dataclass(frozen=True)
class TrainConfig:
    # --- task ---
    task: TaskName = "digits"
    """Task plugin by name: 'digits' (complete a sequence) or 'agent' (multi-turn, a tool answers each turn)."""
    modulus: int = 10
    """N: sequences are a, a+d, a+2d, ... modulo N, each term written as zero-padded decimal digits."""
    prompt_terms_min: int = 3
    """Fewest sequence terms shown in a prompt."""
    prompt_terms_max: int = 5
    """Most sequence terms shown in a prompt."""
    answer_terms: int = 3
    """Terms the policy must write (digits task) or predict one per turn (agent task: number of turns)."""
    held_out_fraction: float = 0.2
    """Share of (start, difference) pairs never trained on; they give the held-out exact-match."""
    tool_latency_s: float = 0.0
    """Seconds the agent task's tool takes to answer between turns."""
    environment: str = ""
    """Agent environment by name, driven over HTTP with the chat vocabulary ('' = the in-process task above)."""
    context_tokens: int = 256
    """Positions of the policy's context when an environment is named (the chat session's whole conversation)."""
    # --- policy ---
    n_layer: int = 2
    """Transformer blocks in the policy."""
    n_head: int = 4
    """Attention heads per block."""
    d_model: int = 64
    """Width of the residual stream."""
    # --- algorithm ---
    steps: int = 400
    """Training steps (weight versions published) before the run ends."""
    prompts_per_step: int = 128
    """Groups (prompts) per training batch."""
    group_size: int = 8
    """G: samples drawn per prompt; advantages are normalized within the group."""
    lr: float = 0.001
    """Adam learning rate."""
    clip_eps: float = 0.2
    """PPO ratio clip range."""
    ppo_epochs: int = 1
    """Optimizer passes over each batch."""
    minibatches: int = 4
    """Optimizer steps per pass (the batch is split into this many minibatches)."""
    entropy_coef: float = 0.03
    """Weight of the entropy bonus on all generated tokens (without it the policy collapses)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty against the behaviour policy (0 disables it)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    temperature: float = 1.0
    """Sampling temperature at generation."""
    filter_zero_variance: bool = True
    """Drop groups whose rewards are all equal (they carry no advantage signal)."""
    min_valid_attempts: int = 1
    """Drop groups with fewer valid (finished, well-formed) attempts than this."""
    # --- topology ---
    mode: Mode = "colocated"
    """'local' (one process, no Ray), 'colocated' (generation paused while training) or 'disaggregated'."""
    max_staleness: int = 0
    """Largest allowed gap between the trainer's version and the version of any consumed token."""
    num_engines: int = 2
    """Generation engine actors (each holds a policy copy, a request gate and per-session caches)."""
    num_workers: int = 2
    """Rollout worker actors running episodes."""
    worker_capacity: int = 16
    """Episodes (groups) a worker runs concurrently."""
    num_servers: int = 1
    """Session server entrypoints, OpenAI-compatible HTTP servers in front of the engines (docs/agents.md); only
    a run that names an `environment` has them (the in-process tasks' policy speaks only their digit vocabulary)."""
    publish_deadline_s: float = 60.0
    """Seconds a weight publication may wait for in-flight requests to drain before the gate is poisoned."""
    poison_wait_s: float = 600.0
    """Seconds a run with a poisoned gate waits for a staff reset (run page) before it fails (0: fail at once)."""
    quiesce_timeout_s: float = 30.0
    """Seconds a checkpoint waits for in-flight groups to finish; then they are aborted and go back to the sampler."""
    # --- evaluation, checkpoints, phases ---
    eval_every: int = 10
    """Steps between evaluations (greedy exact-match on training and held-out prompts); 0 disables."""
    eval_prompts: int = 256
    """Prompts per evaluation split."""
    checkpoint_every: int = 0
    """Steps between checkpoints (0: only at the end and on stop)."""
    phase: Phase = "full"
    """'full' training, or a local debug phase: 'rollout_only' saves one batch, 'train_only' trains from it."""
    batch_path: str = ""
    """File the local debug phases write/read the batch to/from (the platform accepts only '')."""
    target_exact_match: float = 0.0
    """Stop early once training exact-match reaches this (0: never)."""
    time_limit_s: float = 0.0
    """Stop after this many seconds of training (0: none of its own; the platform's run time limit still holds)."""
    # --- sample capture (trainer/samples.py; stored by the platform in its own table) ---
    samples_groups_per_step: int = 2
    """Groups per step posted whole as `sample` events (a seeded draw), besides the best and the worst (0: none)."""
    samples_best_worst: bool = True
    """Also post each step's groups with the best and the worst mean reward."""
    samples_keep: int = 20_000
    """Samples the platform keeps for this run (the oldest go first); capped by its SAMPLES_MAX_PER_RUN setting."""
    seed: int = 0
    """Seed for data split, shuffles, initialization and sampling."""
    device: Device = "auto"
    """Trainer device: 'auto' uses a GPU when the run's resources include one and torch sees it."""
    # --- resources (what the run asks Ray for; trainer/resources.py turns them into placement bundles) ---
    driver_cpus: float = 0.2
    """CPUs reserved for the job's driver process ('local' mode: the whole run, learner_cpus added)."""
    learner_cpus: float = 0.25
    """CPUs reserved for the learner actor (torch threads follow: one per whole CPU, at least one)."""
    engine_cpus: float = 0.4
    """CPUs reserved for each generation engine actor."""
    worker_cpus: float = 0.35
    """CPUs reserved for each rollout worker actor."""
    server_cpus: float = 0.05
    """CPUs reserved for each session server actor (it relays requests to the engines and records tokens)."""
    learner_gpus: float = 0.0
    """GPUs for the learner ('local' mode: for the driver); a run asking for any is admitted only onto GPUs."""
    engine_gpus: float = 0.0
    """GPUs for each engine actor."""
    actor_memory_mb: int = 512
    """Memory reserved for each process of the run (driver and every actor), in MiB."""
    placement_strategy: PlacementStrategy = "PACK"
    """How the run's actor bundles are placed on nodes: 'PACK' (few nodes), 'STRICT_PACK' (one node) or 'SPREAD'."""
    placement_timeout_s: float = 300.0
    """Seconds the job waits for its placement group; past it the run goes back to the queue (it does not fail)."""

    def __post_init__(self) -> None:
        for name, (lo, hi) in _BOUNDS.items():
            value = getattr(self, name)
            if lo is not None and value < lo:
                raise ConfigError(name, f"must be >= {lo}, got {value!r}")
            if hi is not None and value > hi:
                raise ConfigError(name, f"must be <= {hi}, got {value!r}")
        if self.prompt_terms_min > self.prompt_terms_max:
            raise ConfigError("prompt_terms_min", "must not exceed prompt_terms_max")
        if self.d_model % self.n_head:
            raise ConfigError("n_head", f"must divide d_model ({self.d_model})")
        if self.min_valid_attempts > self.group_size:
            raise ConfigError("min_valid_attempts", f"must not exceed group_size ({self.group_size})")
        for name in ("learner_gpus", "engine_gpus"):
            value = getattr(self, name)
            if value > 1 and value != int(value):
                raise ConfigError(name, f"must be a whole number above 1 (Ray shares only single GPUs), got {value!r}")
        if len(self.environment) > 200:
            raise ConfigError("environment", f"must be at most 200 characters, got {len(self.environment)}")
        if self.phase != "full" and not self.batch_path:
            raise ConfigError("batch_path", f"is required for phase {self.phase!r}")
        params = policy_parameters(self)
        if params > PARAMETER_BUDGET:
            raise ConfigError(
                "d_model",
                f"the policy would have {params:,} parameters (n_layer={self.n_layer}, "
                f"d_model={self.d_model}); the budget is {PARAMETER_BUDGET:,}",
            )

    @classmethod
    def from_dict(cls, d: Any, *, allow_debug: bool = True) -> TrainConfig:
        """Build a config from decoded JSON; missing keys take defaults, anything else wrong is a ConfigError.

        `allow_debug=False` (the platform, and `python -m trainer run --sandboxed`) refuses the debug phases and
        any `batch_path`: a submitted config never names a file, so it cannot write or unpickle one."""
        if not isinstance(d, dict):
            raise ConfigError("config", f"expected a JSON object, got {type(d).__name__}")
        hints = typing.get_type_hints(cls)
        known = {f.name for f in dataclasses.fields(cls)}
        for key in d:
            if key not in known:
                raise ConfigError(str(key), f"unknown key (known: {', '.join(sorted(known))})")
        values = {key: coerce(key, hints[key], value) for key, value in d.items()}
        if not allow_debug:
            if values.get("phase", "full") != "full":
                raise ConfigError(
                    "phase", "only 'full' is accepted here (the debug phases are for local runs of python -m trainer)"
                )
            if values.get("batch_path", ""):
                raise ConfigError(
                    "batch_path", "must be empty here (the debug phases are for local runs of python -m trainer)"
                )
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainConfig:
        return TrainConfig.from_dict({**self.to_dict(), **changes})

    @classmethod
    def json_schema(cls, *, allow_debug: bool = True) -> dict[str, Any]:
        """JSON schema (draft 2020-12) with type, default, description, enum and bounds for every field
        (`allow_debug=False`: what the platform accepts, phase 'full' only and an empty batch_path)."""
        return build_schema(cls, _BOUNDS, PARAMETER_BUDGET, allow_debug=allow_debug)


# (minimum, maximum) per numeric field; None means unbounded on that side. Every field that scales work (steps,
# batch, group, evaluation, actors, concurrency, model, dataset, waits) has a maximum sized for a small RL run
# on a cluster: the defaults and the bench configs (bench/*.py: steps 10000 with a time limit) stay inside.
_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "modulus": (2, 100),
    "prompt_terms_min": (2, 16),
    "prompt_terms_max": (2, 16),
    "answer_terms": (1, 16),
    "held_out_fraction": (0.0, 0.9),
    "tool_latency_s": (0.0, 60.0),
    "context_tokens": (16, 4096),
    "n_layer": (1, 24),
    "n_head": (1, 32),
    "d_model": (8, 1024),
    "steps": (0, 10_000),
    "prompts_per_step": (1, 512),
    "group_size": (2, 64),
    "lr": (0.0, 1.0),
    "clip_eps": (0.0, 10.0),
    "ppo_epochs": (1, 16),
    "minibatches": (1, 1024),
    "entropy_coef": (0.0, 10.0),
    "kl_coef": (0.0, 100.0),
    "max_grad_norm": (0.0, 1e6),
    "temperature": (0.01, 100.0),
    "min_valid_attempts": (0, 64),
    "max_staleness": (0, 16),
    "num_engines": (1, 16),
    "num_workers": (1, 16),
    "num_servers": (1, 4),
    "worker_capacity": (1, 256),
    "publish_deadline_s": (0.1, 600.0),
    "quiesce_timeout_s": (0.01, 600.0),
    "poison_wait_s": (0.0, 86_400.0),
    "eval_every": (0, 10_000),
    "eval_prompts": (1, 1024),
    "checkpoint_every": (0, 10_000),
    "target_exact_match": (0.0, 1.0),
    "time_limit_s": (0.0, 86_400.0),
    "samples_groups_per_step": (0, 64),
    "samples_keep": (0, 1_000_000),
    "seed": (0, 2**31 - 1),
    "driver_cpus": (0.01, 64.0),
    "learner_cpus": (0.01, 64.0),
    "engine_cpus": (0.01, 64.0),
    "worker_cpus": (0.01, 64.0),
    "server_cpus": (0.01, 64.0),
    "learner_gpus": (0.0, 8.0),
    "engine_gpus": (0.0, 8.0),
    "actor_memory_mb": (64, 262_144),
    "placement_timeout_s": (1.0, 3600.0),
}

# Most parameters the policy may have (the default policy has ~0.1M): 25M is e.g. 8 blocks of width 448.
PARAMETER_BUDGET = 25_000_000


def policy_parameters(cfg: TrainConfig) -> int:
    """Exact parameter count of the policy `cfg` builds (trainer.policy.TinyTransformer; tested against it)."""
    d, layers = cfg.d_model, cfg.n_layer
    if cfg.environment:
        from agents.chat import VOCAB_SIZE

        vocab, block_size = VOCAB_SIZE, cfg.context_tokens
    else:
        vocab, block_size = len(VOCAB), episode_block_size(cfg.modulus, cfg.prompt_terms_max, cfg.answer_terms)
    per_block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return vocab * d + block_size * d + layers * per_block + 2 * d + vocab * d
