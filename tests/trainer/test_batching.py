"""The batching engine's pure logic (admission, rows, eviction, sizing) and its results in one process: batched
equals one-at-a-time bit for bit, requests join and leave between steps, rejections are safe and counted."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rollout.errors import RejectedBeforeGeneration, SessionGoneError
from trainer.batching import Batcher, SessionTable
from trainer.config import TrainConfig
from trainer.engine import Engine
from trainer.engine_sizing import MAX_SESSIONS, MiB, engine_sizing
from trainer.episodes import GroupTicket, run_group
from trainer.kvpool import kv_bytes_per_row
from trainer.policy import sample_tokens
from trainer.problems import task_build


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


# --- Batcher ---------------------------------------------------------------------------------------------
def test_batcher_admits_up_to_max_batch_oldest_first_and_skips_what_cannot_be_placed() -> None:
    b: Batcher[str] = Batcher(max_batch=3)
    for r in ("a", "big", "c", "d", "e"):
        b.submit(r)
    assert b.admit(lambda r: r != "big") == ["a", "c", "d"]  # "big" waits, the ones behind it are not blocked
    assert b.inflight == 5 and list(b.waiting) == ["big", "e"]
    assert b.retire(lambda r: r in ("a", "d")) == ["a", "d"]
    assert b.admit(lambda r: True) == ["big", "e"]  # joined between steps, oldest first
    assert b.active == ["c", "big", "e"]
    assert b.drop_waiting(lambda r: True) == [] and len(b) == 3
    with pytest.raises(ValueError):
        Batcher(max_batch=0)


# --- SessionTable ----------------------------------------------------------------------------------------
def test_table_evicts_the_least_recently_used_idle_session_into_a_tombstone() -> None:
    t = SessionTable("e0", rows=8, max_sessions=3, clock=Clock())
    a, b = t.place("a", 4), t.place("b", 4)
    assert a is not None and b is not None and sorted(a.rows + b.rows) == list(range(8))
    t.touch(a)  # b is now the least recently used
    c = t.place("c", 4)
    assert c is not None and sorted(c.rows) == sorted(b.rows) and t.evictions == 1
    with pytest.raises(SessionGoneError, match="evicted"):
        t.check("b", continues=True, group=4)
    a.busy = c.busy = True  # both in flight: nothing can be evicted, the new session waits
    assert t.place("d", 4) is None and t.evictions == 1
    t.finished("a")
    assert t.place("d", 4) is not None and t.evictions == 2


def test_table_refuses_what_cannot_run_and_never_answers_a_continuing_session_without_cache() -> None:
    t = SessionTable("e0", rows=4, max_sessions=4)
    with pytest.raises(SessionGoneError, match="no cache"):
        t.check("new", continues=True, group=2)
    with pytest.raises(RejectedBeforeGeneration, match="KV capacity"):
        t.check("huge", continues=False, group=5)
    s = t.place("s", 2)
    assert s is not None and t.check("s", continues=True, group=2) is s
    with pytest.raises(RejectedBeforeGeneration, match="rows"):
        t.check("s", continues=True, group=3)
    s.busy = True
    with pytest.raises(RejectedBeforeGeneration, match="in flight"):
        t.check("s", continues=True, group=2)
    t.end("s")  # while busy: freed only when its request leaves
    assert t.rows_used == 2
    t.finished("s")
    assert t.rows_used == 0 and "s" not in t.sessions


# --- sizing ----------------------------------------------------------------------------------------------
def test_sizing_from_the_device() -> None:
    per_row = kv_bytes_per_row(2, 64, 16)
    assert per_row == 2 * 2 * 17 * 64 * 4
    cpu = engine_sizing(device="cpu", n_layer=2, d_model=64, block_size=16, group_size=8, actor_memory_mb=512)
    assert cpu.max_batch == 64 and cpu.max_sessions == (512 * MiB // 4) // (per_row * 8)
    assert cpu.kv_rows == cpu.max_sessions * 8 and cpu.kv_bytes <= 512 * MiB // 4
    gpu = engine_sizing(
        device="cuda",
        n_layer=8,
        d_model=448,
        block_size=64,
        group_size=8,
        actor_memory_mb=512,
        device_memory_bytes=80 * 1024 * MiB,
        gpu_share=0.5,
    )
    big_row = kv_bytes_per_row(8, 448, 64)
    assert gpu.max_batch == 256
    assert gpu.max_sessions == min(MAX_SESSIONS, int(80 * 1024 * MiB * 0.5 * 0.5) // (big_row * 8))
    tiny = engine_sizing(device="cpu", n_layer=24, d_model=1024, block_size=400, group_size=64, actor_memory_mb=64)
    assert tiny.max_sessions == 1  # never below one session
    with pytest.raises(ValueError):
        engine_sizing(device="cuda", n_layer=2, d_model=64, block_size=16, group_size=8, actor_memory_mb=512)


# --- the engine in one process ---------------------------------------------------------------------------
CFG = TrainConfig(task="agent", group_size=4, mode="local", device="cpu", seed=3)


async def _episodes(engine: Engine, tickets: list[int], concurrent: bool) -> list:
    task = task_build(CFG)

    async def one(gid: int, stagger: float = 0.0):
        await asyncio.sleep(stagger)  # staggered starts: fresh prompts join steps of continuing turns
        prompt = task.train_prompts[gid]
        return await run_group(
            task, GroupTicket(gid, 0, gid), prompt, group_size=4, seed=3, generate=engine.generate, session_id=f"s{gid}"
        )

    if concurrent:
        return list(await asyncio.gather(*(one(g, 0.003 * (g % 6)) for g in tickets)))
    return [await one(g) for g in tickets]


def test_batched_equals_one_at_a_time_bit_for_bit() -> None:
    """24 three-turn episodes at once (prompts of different lengths, joiners and decoders mixed) give the same
    tokens and the same behaviour log-probs as the same episodes run one after another on a max_batch=1 engine."""
    tickets = list(range(24))
    batched_engine = Engine(CFG, "b", max_batch=64)
    batched = asyncio.run(_episodes(batched_engine, tickets, concurrent=True))
    serial = asyncio.run(_episodes(Engine(CFG, "s", max_batch=1), tickets, concurrent=False))
    assert batched_engine.steps < sum(len(g.rows[0].turns) for g in batched)  # they really shared steps
    for b, s in zip(batched, serial):
        assert b.tokens == s.tokens
        assert b.logprobs == s.logprobs  # exact floats, not approximately
        assert [r.token_request_ids() for r in b.rows] == [r.token_request_ids() for r in s.rows]
        assert b.versions == [0] and all(len(r.turns) == 3 for r in b.rows)


def test_greedy_tokens_equal_the_reference_sampler_without_batching() -> None:
    """The engine's pooled, batched forward gives the tokens of trainer.policy.sample_tokens (the unbatched
    cache path the engine replaced), turn after turn."""
    engine = Engine(CFG, "e", max_batch=64)
    task = task_build(CFG)
    prompts = [task.prompt_tokens(task.train_prompts[i]) for i in range(6)]

    async def batched() -> list[list[list[int]]]:
        async def two_turns(i: int) -> list[list[int]]:
            a = await engine.generate(f"s{i}", [prompts[i]] * 4, 2, i, f"s{i}/t0", True)
            b = await engine.generate(f"s{i}", [[5, 9]] * 4, 2, i, f"s{i}/t1", True, True)
            return [x + y for x, y in zip(a["tokens"], b["tokens"])]

        return list(await asyncio.gather(*(two_turns(i) for i in range(6))))

    got = asyncio.run(batched())
    for i in range(6):
        t0, _, cache, pending = sample_tokens(
            engine.model, torch.tensor([prompts[i]] * 4), None, 2, temperature=1.0, generator=None, greedy=True
        )
        feed = torch.cat([pending, torch.tensor([[5, 9]] * 4)], dim=1)
        t1, *_ = sample_tokens(engine.model, feed, cache, 2, temperature=1.0, generator=None, greedy=True)
        assert got[i] == torch.cat([t0, t1], dim=1).tolist()


def test_sampled_tokens_equal_torch_multinomial_with_the_requests_generator() -> None:
    """Sampling (not greedy) gives exactly the tokens and log-probs of trainer.policy.sample_tokens, i.e.
    torch.multinomial with a generator seeded by the request's seed, turn after turn, six sessions batched. An
    inverse-CDF sampler with the same seeds, correct in every marginal, learned about half as fast per step
    (docs/trainer.md, "Held-out bisect"): this pins the sampler the learning numbers were measured with."""
    engine = Engine(CFG, "e", max_batch=64)
    task = task_build(CFG)
    prompts = [task.prompt_tokens(task.train_prompts[i]) for i in range(6)]

    async def batched() -> list[tuple[list[list[int]], list[list[float]]]]:
        async def two_turns(i: int) -> tuple[list[list[int]], list[list[float]]]:
            a = await engine.generate(f"s{i}", [prompts[i]] * 4, 3, 100 + i, f"s{i}/t0", False)
            b = await engine.generate(f"s{i}", [[5, 9]] * 4, 2, 200 + i, f"s{i}/t1", False, True)
            tokens = [x + y for x, y in zip(a["tokens"], b["tokens"])]
            return tokens, [x + y for x, y in zip(a["logprobs"], b["logprobs"])]

        return list(await asyncio.gather(*(two_turns(i) for i in range(6))))

    got = asyncio.run(batched())
    for i in range(6):
        first = torch.Generator().manual_seed(100 + i)
        t0, lp0, cache, pending = sample_tokens(
            engine.model, torch.tensor([prompts[i]] * 4), None, 3, temperature=1.0, generator=first, greedy=False
        )
        feed = torch.cat([pending, torch.tensor([[5, 9]] * 4)], dim=1)
        second = torch.Generator().manual_seed(200 + i)
        t1, lp1, *_ = sample_tokens(engine.model, feed, cache, 2, temperature=1.0, generator=second, greedy=False)
        assert got[i][0] == torch.cat([t0, t1], dim=1).tolist()
        assert torch.allclose(torch.tensor(got[i][1]), torch.cat([lp0, lp1], dim=1), atol=1e-5)


def test_requests_join_a_running_batch_and_finished_ones_leave_at_once() -> None:
    engine = Engine(CFG, "e", max_batch=8)
    engine.throttle(0.01)
    prompt = task_build(CFG).prompt_tokens(task_build(CFG).train_prompts[0])

    async def main() -> None:
        long = asyncio.ensure_future(engine.generate("long", [prompt] * 4, 8, 0, "long/t0"))
        while engine.steps < 2:
            await asyncio.sleep(0.005)
        assert engine.snapshot()["inflight"] == 1 and engine.gate.active == 1
        short = await engine.generate("short", [prompt] * 4, 2, 1, "short/t0")  # joins the running batch
        assert not long.done()  # the short one left while the long one kept going
        assert engine.snapshot()["batch"] == 1
        out = await long
        assert len(out["tokens"][0]) == 8 and len(short["tokens"][0]) == 2

    asyncio.run(main())
    assert engine.steps == 8  # the short request's two tokens rode along two of the long one's steps
    # the batching the run page shows (rows / step): 8 steps of the long one's 4 rows, 2 of them with the short's 4
    assert engine.snapshot()["rows_stepped"] == 8 * 4 + 2 * 4


def test_a_request_over_the_context_is_rejected_safely_and_counted() -> None:
    engine = Engine(CFG, "e")
    block = engine.model.block_size

    async def main() -> None:
        with pytest.raises(RejectedBeforeGeneration, match="exceeds"):
            await engine.generate("s", [[1] * block] * 4, 2, 0, "s/t0")
        with pytest.raises(RejectedBeforeGeneration, match="different lengths"):
            await engine.generate("s", [[1, 2], [1]], 2, 0, "s/t0")
        await engine.generate("ok", [[1, 2]] * 4, 2, 0, "ok/t0")  # the gate stays open

    asyncio.run(main())
    snap = engine.snapshot()
    assert snap["rejections"] == 2 and snap["safe_failures"] == 2 and snap["state"] == "open"
    assert snap["failures"] == 0 and snap["poison_reason"] is None  # failures counts unsafe outcomes only


def test_eviction_tombstones_the_session_and_its_next_turn_gets_session_gone() -> None:
    engine = Engine(CFG, "e", max_sessions=2)

    async def main() -> None:
        for s in ("a", "b"):
            await engine.generate(s, [[1, 2, 3]] * 4, 1, 0, f"{s}/t0")
        await engine.generate("c", [[1, 2, 3]] * 4, 1, 0, "c/t0")  # evicts "a", the least recently used
        with pytest.raises(SessionGoneError, match="evicted"):
            await engine.generate("a", [[4]] * 4, 1, 0, "a/t1", False, True)
        await engine.generate("b", [[4]] * 4, 1, 0, "b/t1", False, True)  # still cached

    asyncio.run(main())
    snap = engine.snapshot()
    assert snap["evictions"] == 1 and snap["max_sessions"] == 2 and snap["sessions_gone"] == 1
    assert snap["state"] == "open" and snap["poison_reason"] is None


def test_a_final_turn_ends_its_session_when_answered() -> None:
    engine = Engine(CFG, "e")

    async def main() -> None:
        first = await engine.generate("s", [[1, 2, 3]] * 4, 1, 0, "s/t0")
        assert first["ended"] is False and engine.snapshot()["sessions"] == 1
        last = await engine.generate("s", [[4]] * 4, 1, 0, "s/t1", False, True, True)
        assert last["ended"] is True  # the caller sends no end_session: the rows are free already
        assert engine.snapshot()["sessions"] == 0 and engine.snapshot()["kv_rows_used"] == 0
        with pytest.raises(SessionGoneError):  # a turn after the last is never answered without its context
            await engine.generate("s", [[5]] * 4, 1, 0, "s/t2", False, True)

    asyncio.run(main())


def test_a_failed_step_fails_its_requests_and_poisons_the_gate(monkeypatch) -> None:
    engine = Engine(CFG, "e")

    def broken(*args, **kwargs):
        raise MemoryError("out of KV memory")

    monkeypatch.setattr("trainer.engine_step.run_step", broken)  # engine.ops is that module

    async def main() -> None:
        with pytest.raises(RuntimeError, match="step failed"):
            await engine.generate("s", [[1, 2]] * 4, 2, 0, "s/t0")

    asyncio.run(main())
    snap = engine.snapshot()
    assert snap["state"] == "poisoned" and snap["inflight"] == 0 and snap["kv_rows_used"] == 0
    with pytest.raises(SessionGoneError, match="step failed"):
        engine.table.check("s", continues=True, group=4)


def test_a_rows_numbers_do_not_depend_on_the_rows_that_share_its_step() -> None:
    """pooled_step on random rows (random cache lengths, real token counts and padding, prefill widths >= 4 as
    the engine pads them, and decode steps of one token) gives every row exactly the logits it gets alone, whether
    the step reads the rows' caches through the gather buffers or (side-by-side rows, `span`) as a pool view."""
    import random

    from trainer.kvpool import pooled_step

    rng = random.Random(0)
    engine = Engine(CFG, "e")
    model, pool = engine.model, engine.pool
    torch.manual_seed(0)
    pool.clear(list(range(100)))
    for t in (*pool.k, *pool.v):
        t[:100].normal_()
    saved = [t[:100].clone() for t in (*pool.k, *pool.v)]

    def restore() -> None:
        for t, s in zip((*pool.k, *pool.v), saved):
            t[:100].copy_(s)

    for trial in range(60):
        decode = trial % 3 == 0
        B = rng.randint(1, 30)
        side_by_side = trial % 5 == 1
        first = rng.randint(0, 100 - B)
        rows = torch.arange(first, first + B) if side_by_side else torch.tensor(rng.sample(range(100), B))
        start = torch.tensor([rng.randint(0, pool.width - 8) for _ in range(B)])
        valid = torch.ones(B, dtype=torch.long) if decode else torch.tensor([rng.randint(1, 6) for _ in range(B)])
        width = 1 if decode else max(4, int(valid.max()) + rng.randint(0, 2))
        tokens = torch.randint(0, 12, (B, 8))
        restore()
        span = slice(first, first + B) if side_by_side else None
        together = pooled_step(model, pool, rows, tokens[:, :width], start, valid, span)
        for b in range(B):
            restore()
            alone_width = 1 if decode else max(4, int(valid[b]) + rng.randint(0, 2))
            alone_span = slice(int(rows[b]), int(rows[b]) + 1) if b % 2 else None
            alone = pooled_step(
                model,
                pool,
                rows[b : b + 1],
                tokens[b : b + 1, :alone_width],
                start[b : b + 1],
                valid[b : b + 1],
                alone_span,
            )
            assert torch.equal(alone[0], together[b]), (trial, b)
