"""Pure logic of the trainer: tasks, sampler, advantages, the KV cache, generation determinism."""

from __future__ import annotations

import pytest
import torch

from trainer.algorithm import TrainBatch, group_advantages, logprob_parity
from trainer.config import TrainConfig
from trainer.policy import build_policy, sample_tokens
from trainer.problems import AgentTask, DigitTask, Prompt, decode, encode, task_build
from trainer.sampler import GroupSampler

TASK_KW = dict(modulus=10, prompt_terms_min=3, prompt_terms_max=5, answer_terms=3, held_out_fraction=0.2, seed=0)


def test_digit_task_partial_credit_stops_at_first_wrong_character() -> None:
    task = DigitTask(**TASK_KW)
    p = Prompt(start=3, diff=2, shown=3)  # 3 5 7 | 9 1 3
    assert decode(task.prompt_tokens(p)) == "^357>"
    assert task.answer_text(p) == "913"
    assert task.score(p, encode("913")) == (1.0, 1.0)
    assert task.score(p, encode("903")) == (pytest.approx(1 / 3), 0.0)  # the right 3 after a miss earns nothing
    assert task.score(p, encode("013")) == (0.0, 0.0)


def test_held_out_pairs_are_never_trained_on() -> None:
    task = DigitTask(**TASK_KW)
    train = {(p.start, p.diff) for p in task.train_prompts}
    held = {(p.start, p.diff) for p in task.held_out_prompts}
    assert not train & held
    assert len(held) == 20 and len(train) == 80
    assert len(task.train_prompts) == 80 * 3


def test_agent_task_tool_reveals_the_true_term_between_turns() -> None:
    task = AgentTask(**TASK_KW)
    p = Prompt(start=1, diff=3, shown=3)  # 1 4 7 | 0 3 6
    assert task.turns == 3 and task.turn_len() == 1
    assert decode(task.tool_reply(p, 0, encode("5"))) == "0>"  # wrong guess: the tool still says 0
    assert task.tool_reply(p, 2, encode("036")) == []  # nothing after the last turn
    assert task.score(p, encode("036")) == (1.0, 1.0)
    assert task.score(p, encode("536")) == (pytest.approx(2 / 3), 0.0)  # turns are scored independently


def test_tasks_are_pluggable_by_name() -> None:
    assert isinstance(task_build(TrainConfig(task="agent")), AgentTask)
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        task_build(type("C", (), {**TrainConfig().to_dict(), "task": "nope"})())


def test_sampler_is_deterministic_and_resumes_exactly() -> None:
    a = GroupSampler(7, seed=3)
    seq = [a.next() for _ in range(20)]
    assert [t.group_id for t in seq] == list(range(20))
    assert [t.epoch for t in seq] == [0] * 7 + [1] * 7 + [2] * 6
    for e in range(2):  # each epoch is a permutation of the dataset
        assert sorted(t.prompt_index for t in seq[e * 7 : (e + 1) * 7]) == list(range(7))
    assert [t.prompt_index for t in seq[:7]] != [t.prompt_index for t in seq[7:14]]
    b = GroupSampler(7, seed=3)
    [b.next() for _ in range(9)]
    c = GroupSampler(7, seed=3)
    c.load_state_dict(b.state_dict())
    assert [c.next() for _ in range(11)] == seq[9:]
    assert c.progress() == {"epoch": 2, "group_count": 20, "dataset_size": 7, "consumed_in_epoch": 6}


def test_returned_groups_come_back_first_with_their_identity() -> None:
    s = GroupSampler(5, seed=0)
    first = s.get_groups(4)
    s.return_groups([first[2], first[0]])
    again = s.get_groups(3)
    assert [t.group_id for t in again] == [0, 2, 4]
    assert again[0] == first[0] and again[1] == first[2]
    restored = GroupSampler(5, seed=0)
    s.return_groups([again[1]])
    restored.load_state_dict(s.state_dict())
    assert restored.get_groups(2)[0] == first[2]
    with pytest.raises(ValueError, match="different dataset"):
        GroupSampler(6, seed=0).load_state_dict(s.state_dict())


def test_group_advantages_are_normalized_within_each_group() -> None:
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]]))
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-4)
    assert torch.equal(adv[1], torch.zeros(4))  # zero variance: no signal (such groups are filtered)


def test_logprob_parity_compares_only_rows_sampled_wholly_with_the_trained_weights() -> None:
    # Three rows of 4 next-token positions: the prompt (not generated), then two turns of generated tokens.
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]] * 3)
    versions = torch.tensor([[-1, 3, 3, 3], [-1, 2, 3, 3], [-1, 2, 2, 2]])  # fresh, spans a publication, stale
    behaviour = torch.tensor([[9.0, -1.0, -2.0, -3.0], [9.0, -1.0, -2.0, -3.0], [9.0, -1.0, -2.0, -3.0]])
    learner = torch.tensor([[0.0, -1.5, -2.0, -3.25], [0.0, -1.0, -7.0, -3.0], [0.0, -5.0, -5.0, -5.0]])
    zeros = torch.zeros(3)
    b = TrainBatch(torch.zeros(3, 5, dtype=torch.long), mask, behaviour, zeros, zeros, zeros, versions)
    # Only row 0 counts: row 1's version-3 turn ran on a cache that version 2 computed; row 2 is stale; the
    # prompt position (log-prob 9 vs 0) is not generated.
    assert logprob_parity(learner, b, version=3) == {"logprob_diff_mean": 0.25, "logprob_diff_max": 0.5}
    assert logprob_parity(learner, b, version=2) == {"logprob_diff_mean": 3.0, "logprob_diff_max": 4.0}  # row 2
    assert logprob_parity(learner, b, version=4) == {}  # nothing sampled with version 4: nothing reported


def test_kv_cache_turns_match_a_full_forward_pass() -> None:
    torch.manual_seed(0)
    model = build_policy(TrainConfig(), vocab_size=12, block_size=24).eval()
    seq = torch.randint(0, 12, (3, 14))
    full, _ = model(seq)
    _, cache = model(seq[:, :6])
    part, cache = model(seq[:, 6:11], cache)  # a later turn only feeds its new tokens
    last, _ = model(seq[:, 11:], cache)
    assert torch.allclose(torch.cat([part, last], 1), full[:, 6:], atol=1e-5)


def test_sampling_is_reproducible_from_the_request_seed() -> None:
    torch.manual_seed(0)
    model = build_policy(TrainConfig(), vocab_size=12, block_size=24).eval()
    prompt = torch.randint(0, 12, (4, 5))
    runs = [
        sample_tokens(model, prompt, None, 4, temperature=1.0, generator=torch.Generator().manual_seed(7))
        for _ in range(2)
    ]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert (runs[0][1] <= 0).all()  # log-probabilities


def test_a_later_turn_on_the_bound_engine_feeds_only_its_new_tokens() -> None:
    import asyncio

    from trainer.engine import Engine
    from trainer.episodes import GroupTicket, run_group

    cfg = TrainConfig(task="agent", group_size=4, mode="local")
    task = task_build(cfg)
    engine = Engine(cfg, "e0")
    prompt = task.train_prompts[0]
    group = asyncio.run(
        run_group(task, GroupTicket(0, 0, 0), prompt, group_size=4, seed=0, generate=engine.generate, session_id="s")
    )
    P = len(task.prompt_tokens(prompt))
    # Turn 0 feeds the prompt; turns 1 and 2 feed the last sampled token plus the 2-token tool reply.
    assert engine.tokens_fed == 4 * P + 2 * 4 * 3
    assert group.versions == [0]
    assert all([t.request_id for t in row.turns] == ["s/t0", "s/t1", "s/t2"] for row in group.rows)
    assert engine.gate.snapshot()["active"] == 0 and "s" not in engine.sessions  # the final turn ended it


def test_a_worker_sends_no_end_session_after_a_final_turn_the_engine_answered() -> None:
    """The engine ends a session with its final turn's answer (`last`), so a finished group costs the worker no
    end_session call; its route is forgotten and the engine holds no rows for it."""
    import asyncio

    from rollout.channel import Channel
    from trainer.engine import Engine
    from trainer.episodes import GroupTicket
    from trainer.worker import RolloutWorker

    cfg = TrainConfig(task="agent", group_size=4, mode="local", device="cpu", filter_zero_variance=False)
    engine = Engine(cfg, "e0")
    ended: list[str] = []
    engine.end_session = ended.append  # type: ignore[method-assign]

    async def main() -> list:
        channel = Channel.create("final-turn", local=True)
        try:
            worker = RolloutWorker(cfg, "w0", {"e0": engine}, channel="final-turn")
            return list(await asyncio.gather(*(worker.generate_group(GroupTicket(g, 0, g)) for g in range(3))))
        finally:
            channel.close()

    results = asyncio.run(main())
    assert [r.aborted for r in results] == [False] * 3 and ended == []
    assert engine.snapshot()["sessions"] == 0 and engine.snapshot()["kv_rows_used"] == 0


def test_a_full_router_aborts_the_group_for_a_rerun_and_never_fails_it() -> None:
    """A router at its session cap is back-pressure: the group is aborted (`router_full`, its ticket goes back
    to the sampler) after a short back-off, never raised as a failure that would end the run; once a session
    is released the next group runs."""
    import asyncio

    from rollout.channel import Channel
    from rollout.router import SessionAffinityRouter
    from trainer.engine import Engine
    from trainer.episodes import GroupTicket
    from trainer.worker import RolloutWorker

    cfg = TrainConfig(group_size=2, mode="local", device="cpu", filter_zero_variance=False)
    engine = Engine(cfg, "e0")

    async def main() -> list:
        channel = Channel.create("router-full", local=True)
        try:
            worker = RolloutWorker(cfg, "w0", {"e0": engine}, channel="router-full")
            worker.router = SessionAffinityRouter(["e0"], max_sessions=1)
            worker.router.acquire("someone-else")  # the one session the router may hold
            full = await worker.generate_group(GroupTicket(0, 0, 0))
            worker.router.release("someone-else")
            return [full, await worker.generate_group(GroupTicket(1, 0, 1)), worker.stats()]
        finally:
            channel.close()

    full, then, stats = asyncio.run(main())
    assert full.aborted and full.meta["kind"] == "router_full" and "maximum of 1 sessions" in full.meta["reason"]
    assert not then.aborted and stats["aborted_by"] == {"router_full": 1}


def test_checkpoint_round_trips_ready_groups_and_optimizer_exactly_as_plain_data(tmp_path) -> None:
    """A checkpoint holds no pickled objects (read with weights_only=True), yet restores exactly: ready groups
    in the scheduler state, the learner (Adam), the sampler and both RNG states."""
    import asyncio
    import random

    from rollout.types import GroupResult
    from trainer.checkpoint import checkpoint_load, checkpoint_save
    from trainer.engine import Engine
    from trainer.episodes import GroupTicket, run_group
    from trainer.learner import Learner
    from trainer.plain import scheduler_state_from_plain, scheduler_state_to_plain

    cfg = TrainConfig(task="agent", group_size=4, mode="local", device="cpu")
    task, engine, learner = task_build(cfg), Engine(cfg, "e0"), Learner(cfg)
    ticket = GroupTicket(7, 1, 3)
    group = asyncio.run(
        run_group(task, ticket, task.train_prompts[3], group_size=4, seed=0, generate=engine.generate, session_id="s")
    )
    learner.train_step([group])  # Adam has state now
    result = GroupResult(
        rewards=group.rewards,
        payload=group,
        valid=[True] * 4,
        attempt_ids=group.sample_ids,
        group_id=7,
        meta={"versions": group.versions},
    )
    scheduler = {"ready": [(5, result, ticket)], "seq": 6, "totals": {"delivered": 3}, "dropped": {}, "aborted": 0}
    sampler = GroupSampler(len(task.train_prompts), 0)
    sampler.get_groups(5)
    sampler.return_groups([GroupTicket(2, 0, sampler._perm[2])])
    state = {
        "trainer": learner.state_dict(),
        "sampler": sampler.state_dict(),
        "scheduler": scheduler_state_to_plain(scheduler),
        "python_rng": random.getstate(),
        "consumed": [(0, 0)],
    }
    checkpoint_save(tmp_path, step=1, meta={"version": 1, "config": cfg.to_dict()}, state=state)
    meta, loaded = checkpoint_load(tmp_path)
    assert meta["format"] == 3 and scheduler_state_from_plain(loaded["scheduler"]) == scheduler
    assert loaded["python_rng"] == random.getstate() and loaded["sampler"] == sampler.state_dict()
    fresh = Learner(cfg)
    fresh.load_state_dict(loaded["trainer"])
    for a, b in zip(fresh.model.parameters(), learner.model.parameters()):
        assert torch.equal(a, b)
    got, want = fresh.opt.state_dict(), learner.opt.state_dict()
    assert got["param_groups"] == want["param_groups"] and got["state"].keys() == want["state"].keys()
    for k, slots in want["state"].items():
        assert all(torch.equal(got["state"][k][name], value) for name, value in slots.items())


def test_auto_device_uses_cuda_only_for_a_process_given_a_gpu(monkeypatch) -> None:
    from trainer.learner import Learner, pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # Logical GPUs (a bundle with GPU, no CUDA on the machine): the CPU.
    assert pick_device("auto", gpus=1.0) == torch.device("cpu")
    assert Learner(TrainConfig(device="auto"), gpus=1.0).device == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device("auto", gpus=0.0) == torch.device("cpu")  # CUDA seen but no GPU reserved: not ours
    assert pick_device("auto", gpus=0.5) == torch.device("cuda")
    assert pick_device("cpu", gpus=1.0) == torch.device("cpu")
