"""The batching engine as a real Ray actor: leases held across in-flight generation meet seal, drain, the drain
deadline and cancellation exactly as the gate's contract says; eviction answers SessionGoneError; a dead engine
is restarted at the current version and serves again. Steps are slowed with `Engine.throttle` so that a request
is reliably mid-generation when the publication step under test happens."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from rollout.channel import Channel
from rollout.errors import DrainTimeoutError, GatePoisonedError, SessionGoneError
from rollout.publication import PublicationController
from trainer.config import TrainConfig
from trainer.engine import Engine
from trainer.engine_restart import restart_engine
from trainer.episodes import GroupTicket
from trainer.problems import task_build
from trainer.sampler import GroupSampler
from trainer.topology import build_runtime
from trainer.worker import RolloutWorker

from .test_topology import one_batch

pytestmark = pytest.mark.slow

CFG = TrainConfig(task="agent", group_size=4, mode="colocated", device="cpu", seed=5, tool_latency_s=0.05)
ROWS = [[1, 2, 3]] * 4


def _engine(ray, **kwargs):
    return ray.remote(Engine).options(num_cpus=0.25, max_concurrency=100).remote(CFG, "e0", **kwargs)


def _wait_for(pred: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def _active(ray, engine) -> int:
    return int(ray.get(engine.snapshot.remote())["active"])


def test_seal_finds_a_request_mid_generation_and_drain_waits_for_it(ray_driver) -> None:
    ray = ray_driver
    engine = _engine(ray)
    ray.get(engine.throttle.remote(0.1))
    first = engine.generate.remote("s", ROWS, 8, 0, "s/t0")  # 8 steps of >= 0.1 s
    _wait_for(lambda: _active(ray, engine) == 1)
    pc = PublicationController({"e0": engine})

    async def publication() -> tuple[list[dict], dict, dict]:
        prepare = asyncio.ensure_future(pc.prepare(timeout_s=30))
        seen = []
        while not prepare.done():
            seen.append(await pc.snapshot())
            await asyncio.sleep(0.02)
        await prepare
        drained = await pc.snapshot()
        late = engine.generate.remote("late", ROWS, 1, 0, "late/t0")  # waits at the sealed gate
        while (await pc.snapshot())["waiting"] != 1:
            await asyncio.sleep(0.01)
        await pc.publish(1)
        return seen, drained, await late

    seen, drained, late = asyncio.run(publication())
    assert any(s["state"] == "draining" and s["active"] == 1 for s in seen)  # drain waited on the request
    assert drained["active"] == 0 and drained["state"] == "sealed"
    out = ray.get(first, timeout=1)  # it had finished when drain returned
    assert out["version"] == 0 and len(out["tokens"][0]) == 8 and out["request_id"] == "s/t0"
    assert late["version"] == 1  # admitted after reopen, under the new version
    # What the `version` event reports: the drain waited for the first request, the reopen admitted the late one.
    assert pc.counts() == {
        "drained": 1,
        "admitted_at_reopen": 1,
        "engines": [{"engine": "e0", "drained": 1, "admitted_at_reopen": 1}],
    }
    snap = ray.get(engine.snapshot.remote())
    assert snap["inflight"] == 0 and snap["state"] == "open" and snap["failures"] == 0


def test_the_drain_deadline_aborts_the_request_in_flight_and_poisons(ray_driver) -> None:
    ray = ray_driver
    engine = _engine(ray)
    ray.get(engine.throttle.remote(0.3))
    ref = engine.generate.remote("s", ROWS, 8, 0, "s/t0")
    _wait_for(lambda: _active(ray, engine) == 1)
    ray.get(engine.seal.remote())
    with pytest.raises(DrainTimeoutError):
        ray.get(engine.drain.remote(0.3))
    with pytest.raises(SessionGoneError, match="aborted at the drain deadline"):
        ray.get(ref, timeout=10)
    snap = ray.get(engine.snapshot.remote())
    assert snap["state"] == "poisoned" and "drain deadline" in snap["poison_reason"]
    with pytest.raises(GatePoisonedError):
        ray.get(engine.install_version.remote(1))
    ray.get(engine.throttle.remote(0.0))
    assert "drain deadline" in ray.get(engine.reset.remote("test resolved it"))
    ray.get(engine.drain.remote(5.0))
    ray.get(engine.install_version.remote(1))
    ray.get(engine.reopen.remote())
    with pytest.raises(SessionGoneError, match="aborted"):  # its cache holds a partial turn: gone, not reused
        ray.get(engine.generate.remote("s", [[4]] * 4, 1, 0, "s/t1", False, True))
    assert ray.get(engine.generate.remote("s2", ROWS, 1, 0, "s2/t0"))["version"] == 1


def test_a_cancelled_request_in_flight_poisons_and_nothing_installs_until_reset(ray_driver) -> None:
    ray = ray_driver
    engine = _engine(ray)
    ray.get(engine.throttle.remote(0.1))
    ref = engine.generate.remote("s", ROWS, 8, 0, "s/t0")
    _wait_for(lambda: _active(ray, engine) == 1)
    ray.cancel(ref)
    _wait_for(lambda: ray.get(engine.snapshot.remote())["state"] == "poisoned")
    snap = ray.get(engine.snapshot.remote())
    assert snap["recent_failures"][-1]["outcome"] == "cancelled" and snap["failures"] == 1
    with pytest.raises(GatePoisonedError):
        ray.get(engine.seal.remote())
    with pytest.raises(GatePoisonedError):
        ray.get(engine.install_version.remote(1))
    assert ray.get(engine.snapshot.remote())["version"] == 0
    ray.get(engine.reset.remote("operator checked"))
    ray.get(engine.drain.remote(5.0))
    ray.get(engine.install_version.remote(1))
    ray.get(engine.reopen.remote())
    _wait_for(lambda: ray.get(engine.snapshot.remote())["inflight"] == 0)  # the cancelled one left the batch
    assert ray.get(engine.generate.remote("s2", ROWS, 1, 0, "s2/t0"))["version"] == 1


def test_eviction_aborts_the_episode_never_a_context_less_answer(ray_driver) -> None:
    """Eight concurrent three-turn episodes on an engine that holds three sessions: sessions waiting for the tool
    are evicted, their next turn gets SessionGoneError (across Ray), the worker aborts those groups (counted), and
    every group that did complete has exactly the tokens of an engine that never evicted."""
    ray = ray_driver
    small, big = _engine(ray, max_sessions=3), _engine(ray)
    tickets = [GroupTicket(g, 0, g) for g in range(8)]

    cfg = CFG.replace(filter_zero_variance=False)  # every finished group goes into the channel

    async def run(engine, name: str) -> tuple[list, dict, RolloutWorker]:
        channel = Channel.create(name, local=True)
        try:
            worker = RolloutWorker(cfg, "w0", {"e0": engine}, channel=name)
            results = list(await asyncio.gather(*(worker.generate_group(t) for t in tickets)))
            n = channel.qsize(cfg.task)
            put = {g.group_id: g for g in (channel.get_many(n, key=cfg.task) if n else [])}
            return results, put, worker
        finally:
            channel.close()

    evicting, evicting_groups, worker = asyncio.run(run(small, "evicting"))
    reference, reference_groups, _ = asyncio.run(run(big, "reference"))
    aborted = [r for r in evicting if r.aborted]
    assert aborted and all("evicted" in r.meta["reason"] for r in aborted)
    assert worker.sessions_gone == worker.aborted == len(aborted)
    done = [r.group_id for r in evicting if not r.aborted]
    assert done and sorted(evicting_groups) == done  # what finished is in the channel, nothing aborted is
    for group_id in done:
        g, ref = evicting_groups[group_id], reference_groups[group_id]
        assert g.tokens == ref.tokens and g.logprobs == ref.logprobs
    snap = ray.get(small.snapshot.remote())
    assert snap["evictions"] >= len(aborted) and snap["max_sessions"] == 3 and snap["state"] == "open"
    assert snap["sessions_gone"] == len(aborted) and snap["failures"] == 0


def test_a_killed_engine_is_restarted_at_the_current_version_and_serves_again(ray_driver) -> None:
    ray = ray_driver
    cfg = TrainConfig.from_dict(
        {
            "task": "agent",
            "prompts_per_step": 4,
            "group_size": 4,
            "num_engines": 2,
            "num_workers": 1,
            "worker_capacity": 4,
            "eval_every": 0,
            "seed": 5,
        }
    )
    task = task_build(cfg)
    rt = build_runtime(cfg, GroupSampler(len(task.train_prompts), cfg.seed))
    try:
        assert rt.train_taken(one_batch(rt, 0))["version"] == 1
        rt.loop.run(rt.publication.prepare(timeout_s=30))
        rt.loop.run(rt.publication.publish(1, weights=rt.trainer.weights.remote()))
        old = rt.engines["engine-0"]
        ray.kill(old)
        snap = restart_engine(rt, "engine-0", 1)
        assert snap["version"] == 1 and snap["state"] == "open" and snap["engine"] == "engine-0"
        new, other = rt.engines["engine-0"], rt.engines["engine-1"]
        assert new is not old
        rows = [task.prompt_tokens(task.train_prompts[0])] * 4
        a = ray.get(new.generate.remote("probe", rows, 1, 0, "probe/t0", True))
        b = ray.get(other.generate.remote("probe", rows, 1, 0, "probe/t0", True))
        assert a["version"] == b["version"] == 1 and a["logprobs"] == b["logprobs"]  # the same weights
        batch = rt.scheduler.generate(1)
        assert len(batch.groups) == cfg.prompts_per_step
        (stats,) = rt.workers_call("stats")
        assert stats["engines"] == ["engine-0", "engine-1"]
        assert rt.loop.run(rt.publication.snapshot())["state"] == "open"
    finally:
        rt.close()


def test_weights_staged_while_serving_are_what_the_install_swaps_in(ray_driver) -> None:
    # A publication sends the next version's weights while the gate is open (trainer/publishing.py); the install
    # under the closed gate then takes them. All-zero weights make every next token equally likely: log(1/V).
    import math

    import torch

    from trainer.policy import build_policy

    ray = ray_driver
    engine = _engine(ray)
    task = task_build(CFG)
    zeros = {
        k: torch.zeros_like(v) for k, v in build_policy(CFG, task.vocab_size, task.block_size()).state_dict().items()
    }
    ray.get(engine.throttle.remote(0.05))
    serving = engine.generate.remote("s", ROWS, 4, 0, "s/t0")
    _wait_for(lambda: _active(ray, engine) == 1)
    ray.get(engine.stage_version.remote(1, zeros))  # the gate stays open: the request in flight goes on
    assert ray.get(engine.snapshot.remote())["state"] == "open"
    assert ray.get(serving, timeout=30)["version"] == 0
    ray.get(engine.throttle.remote(0.0))
    ray.get(engine.seal.remote())
    ray.get(engine.drain.remote(5.0))
    with pytest.raises(ValueError, match="v2 was not staged"):  # refused before the gate is touched...
        ray.get(engine.install_version.remote(2, staged=True))
    assert ray.get(engine.snapshot.remote())["version"] == 0
    ray.get(engine.stage_version.remote(1, zeros))  # (the refused install dropped what was staged)
    ray.get(engine.install_version.remote(1, staged=True))  # ...and this one swaps the staged weights in
    ray.get(engine.reopen.remote())
    got = ray.get(engine.generate.remote("s2", ROWS, 3, 0, "s2/t0"))
    assert got["version"] == 1
    uniform = -math.log(task.vocab_size)
    assert all(abs(lp - uniform) < 1e-5 for row in got["logprobs"] for lp in row), got["logprobs"]
