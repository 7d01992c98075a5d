"""Log-prob parity on a real Ray cluster: the per-token log-probs an engine records while generating (several
sessions batched together with padded prefills, and later turns that continue a session from its KV cache) equal
the learner's recomputation of the same tokens with the same weights, within 1e-5 (fp32, CPU). A temperature or
weight mismatch is caught, and the learner's train step reports the mismatch (`logprob_diff_mean`/`_max`) over
the tokens sampled with the weights it trains, and nothing when there are none."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rollout.coalesce import CallCoalescer
from rollout.types import TurnCall
from trainer.config import TrainConfig
from trainer.engine import Engine
from trainer.episodes import Group, GroupTicket, run_group
from trainer.learner import Learner
from trainer.problems import task_build

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5
CFG = TrainConfig(
    task="agent",
    modulus=100,
    group_size=4,
    device="cpu",
    seed=5,
    tool_latency_s=0.0,
    ppo_epochs=1,
    minibatches=1,
    lr=0.01,
)
N_GROUPS = 6


def _generate(ray, engine, n_groups: int = N_GROUPS) -> list[Group]:
    """Episodes of `n_groups` prompts started together on one engine actor, as the rollout workers run them."""
    task = task_build(CFG)

    async def all_groups() -> list[Group]:
        # As a rollout worker sends them: the turns sent in one tick of this loop travel as one generate_many
        # call, so the engine admits them together and batches them (a lone request would be run by itself).
        turns = CallCoalescer(engine, "generate_many")

        async def generate(*args: Any) -> dict[str, Any]:
            return await turns.submit(TurnCall(*args))

        return list(
            await asyncio.gather(
                *(
                    run_group(
                        task,
                        GroupTicket(g, 0, g),
                        task.train_prompts[g],
                        group_size=CFG.group_size,
                        seed=CFG.seed,
                        generate=generate,
                        session_id=f"s{g}",
                    )
                    for g in range(n_groups)
                )
            )
        )

    return asyncio.run(all_groups())


def _diffs(groups: list[Group], learner_logprobs: list[list[list[float]]]) -> list[float]:
    """|engine - learner| for every generated token of every row."""
    return [
        abs(engine_logp - learner_row[pos])
        for g, rows in zip(groups, learner_logprobs)
        for row, learner_row in zip(g.rows, rows)
        for pos, (engine_logp, generated) in enumerate(zip(row.logprobs, row.mask))
        if generated
    ]


@pytest.fixture
def actors(ray_driver):
    """Starts actors on the shared cluster and kills them after the test, passed or failed (a failed assert's
    traceback keeps its handles alive, and with them the CPUs that the next test waits for)."""
    started: list = []

    def start(cls: type, *args: Any, **options: Any) -> Any:
        handle = ray_driver.remote(cls).options(num_cpus=0.25, **options).remote(*args)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        ray_driver.kill(handle)


def test_engine_logprobs_equal_the_learners_for_the_same_weights(ray_driver, actors) -> None:
    ray = ray_driver
    engine = actors(Engine, CFG, "e0", max_concurrency=100)
    learner = actors(Learner, CFG)
    groups = _generate(ray, engine)
    task = task_build(CFG)

    # What was generated: sessions batched together (fewer forward steps than requests x tokens), prompts of
    # different lengths (padded prefills), and every session continued over several turns from its cache.
    snap = ray.get(engine.snapshot.remote())
    requests = N_GROUPS * task.turns
    assert snap["requests"] == requests and snap["steps"] < requests * task.turn_len()
    assert len({len(task.prompt_tokens(task.train_prompts[g.prompt_index])) for g in groups}) > 1
    assert all(g.versions == [0] for g in groups)  # every token sampled with version 0
    assert all(len({t.request_id for t in r.turns}) == len(r.turns) == task.turns > 1 for g in groups for r in g.rows)
    turns = {t.request_id.rsplit("/t", 1)[1] for g in groups for r in g.rows for t in r.turns}
    assert turns == {str(k) for k in range(task.turns)}

    diffs = _diffs(groups, ray.get(learner.logprobs.remote(groups)))
    assert len(diffs) == N_GROUPS * CFG.group_size * task.turns * task.turn_len()
    print(f"parity: max |engine - learner| = {max(diffs):.3e} over {len(diffs)} tokens")
    assert max(diffs) <= TOLERANCE

    # The comparison can fail: a learner at another temperature, or with other weights, is caught.
    hot = actors(Learner, CFG.replace(temperature=0.9))
    assert max(_diffs(groups, ray.get(hot.logprobs.remote(groups)))) > 100 * TOLERANCE

    # The train step measures the same thing on its first forward pass (the weights of version 0, which
    # sampled every token) and reports it; after the step the weights differ and the check sees it.
    stats = ray.get(learner.train_step.remote(groups))
    assert stats["version"] == 1
    assert 0 <= stats["logprob_diff_mean"] <= stats["logprob_diff_max"] <= TOLERANCE
    assert stats["logprob_diff_max"] == pytest.approx(max(diffs), abs=1e-7)
    assert max(_diffs(groups, ray.get(learner.logprobs.remote(groups)))) > 100 * TOLERANCE

    # Trained again at version 1, the version-0 tokens are stale: not comparable, nothing reported.
    stale = ray.get(learner.train_step.remote(groups))
    assert stale["version"] == 2 and "logprob_diff_max" not in stale and "logprob_diff_mean" not in stale
