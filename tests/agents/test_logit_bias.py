"""OpenAI's `logit_bias` end to end without Ray: the engine samples from softmax(logits / T + bias) and records
log-probs under it; the session record carries the bias; the learner scores those tokens under the same bias,
so its log-probs equal the engine's (and differ without it); a biased request leaves the requests sharing its
steps unchanged; a bad bias is refused before generation; bad records (a bad bias or choice) are refused naming the
field."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agents.chat import VOCAB_SIZE, encode, render
from agents.envs.digits import DIGIT_BIAS
from agents.protocol import ApiError, ChatRequest, Limits, logit_bias, parse_body
from agents.trajectory import Segment, Trajectory
from rollout.errors import RejectedBeforeGeneration
from trainer.algorithm import batch_from_groups
from trainer.config import TrainConfig
from trainer.engine import Engine
from trainer.episodes import GroupTicket
from trainer.policy import build_policy, sequence_logprobs
from trainer.problems import policy_shape
from trainer.trajectories import TrajectoryError, TrajectoryRecord, group_from_trajectories, split_choices

torch.set_num_threads(1)
CFG = TrainConfig(
    environment="chat", context_tokens=32, d_model=32, n_head=4, n_layer=1, group_size=2, mode="local", device="cpu"
)
DIGITS = sorted(int(k) for k in DIGIT_BIAS)
PAIRS = [(t, 100.0) for t in DIGITS]
PROMPT = render([{"role": "user", "content": "3579"}])


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return build_policy(CFG, *policy_shape(CFG)).state_dict()


async def _engine() -> Engine:
    engine = Engine(CFG, "e0", max_sessions=8)
    engine.seal()
    await engine.drain(5)
    await engine.install_version(1, _weights())
    engine.reopen()
    return engine


def _record(sid: str, out: dict, bias: list[tuple[int, float]]) -> TrajectoryRecord:
    seg = Segment(
        request_id=out["request_id"],
        prompt_ids=PROMPT,
        completion_ids=out["tokens"][0],
        logprobs=out["logprobs"][0],
        versions=[out["version"]] * len(out["tokens"][0]),
        finish_reason="length",
        engine="e0",
        logit_bias=bias,
    )
    record = Trajectory(session_id=sid, kind="internal", state="ended", segments=[seg])
    return TrajectoryRecord.from_plain(record.model_dump(mode="json"))  # through JSON, as the HTTP endpoint serves it


def test_biased_tokens_and_log_probs_are_the_learners_under_the_same_bias() -> None:
    async def main() -> tuple[Engine, list[dict]]:
        engine = await _engine()
        outs = [await engine.generate(f"s{k}", [PROMPT], 6, k, f"s{k}/0", logit_bias=PAIRS) for k in range(8)]
        return engine, outs

    engine, outs = asyncio.run(main())
    sampled = [t for out in outs for t in out["tokens"][0]]
    assert set(sampled) <= set(DIGITS) and len(set(sampled)) > 3  # only digits, and not one digit always
    records = [_record(f"s{k}", out, PAIRS) for k, out in enumerate(outs)]
    assert records[0].segments[0].logit_bias == tuple(PAIRS)
    group = group_from_trajectories(GroupTicket(0, 0, 0), records, [0.0] * 8, max_tokens=32, vocab_size=VOCAB_SIZE)
    assert group.rows[0].turns[0].logit_bias == tuple(PAIRS)
    batch = batch_from_groups([group], vocab_size=VOCAB_SIZE)
    assert batch.bias_index is not None and batch.bias_table is not None
    assert batch.bias_table.shape == (2, VOCAB_SIZE) and batch.bias_table[0].abs().sum() == 0
    # Positions predicting a generated token (the shifted mask) use bias row 1, every other position row 0.
    assert torch.equal(batch.bias_index.bool(), batch.mask.bool())
    engine.model.eval()
    with torch.no_grad():
        biased, _ = sequence_logprobs(engine.model, batch.tokens, CFG.temperature, batch.bias())
        plain, _ = sequence_logprobs(engine.model, batch.tokens, CFG.temperature)
    generated = batch.mask > 0
    diff = (biased - batch.behaviour_logp)[generated].abs()
    assert diff.max().item() < 1e-4, diff.max().item()
    # Without the bias the learner would score these tokens under the 101-id distribution: about log(10/101) lower.
    assert (plain - batch.behaviour_logp)[generated].mean().item() < -1.0
    sub = batch.select(torch.tensor([1, 3]))
    assert sub.tokens.shape[0] == 2 and torch.equal(sub.bias_table, batch.bias_table)


def test_greedy_under_a_bias_is_the_biased_argmax_and_others_in_the_step_are_unchanged() -> None:
    async def run(together: bool) -> tuple[dict, dict | None]:
        engine = await _engine()
        engine.throttle(0.001)  # steps on the thread, so both requests share steps
        plain = engine.generate("p", [PROMPT], 5, 7, "p/0")
        if not together:
            return await plain, None
        a, b = await asyncio.gather(plain, engine.generate("b", [PROMPT], 5, 3, "b/0", greedy=True, logit_bias=PAIRS))
        return a, b

    alone, _ = asyncio.run(run(False))
    shared, biased = asyncio.run(run(True))
    assert shared["tokens"] == alone["tokens"] and shared["logprobs"] == alone["logprobs"]
    assert biased is not None and set(biased["tokens"][0]) <= set(DIGITS)
    # Greedy under +100 on the digits: each token is the most likely digit, so its log-prob is the largest one
    # of the renormalized digits' distribution (>= log(1/10)).
    assert all(lp >= -2.303 for lp in biased["logprobs"][0])


def test_a_bad_bias_is_refused_before_generation() -> None:
    async def main() -> None:
        engine = await _engine()
        for bad in ([(VOCAB_SIZE, 1.0)], [(-1, 1.0)], [(3, 100.5)], [(3, float("nan"))]):
            with pytest.raises(RejectedBeforeGeneration, match="logit_bias"):
                await engine.generate("g", [PROMPT], 2, 0, "g/0", logit_bias=bad)
        snap = engine.gate.snapshot()
        assert snap["active"] == 0 and snap["state"] == "open" and snap["safe_failures"] == 4

    asyncio.run(main())


def test_protocol_reads_logit_bias_as_sorted_pairs_and_names_a_bad_key() -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"20": -3, "7": 100, "15": 0.5}}
    assert logit_bias(parse_body(ChatRequest, body, Limits()), VOCAB_SIZE) == ((7, 100.0), (15, 0.5), (20, -3.0))
    for key, value, param in (("x7", 1, "logit_bias.x7"), ("7" * 30, 1, "logit_bias." + "7" * 20), ("5", -101, None)):
        with pytest.raises(ApiError) as exc:
            logit_bias(parse_body(ChatRequest, {**body, "logit_bias": {key: value}}, Limits()), VOCAB_SIZE)
        assert exc.value.status == 400 and exc.value.param == (param or f"logit_bias.{key}")
    assert encode("0") == [DIGITS[0]] and len(DIGITS) == 10


def test_records_with_a_bad_bias_or_no_vocab_size_are_refused() -> None:
    out = {"request_id": "r/0", "tokens": [[DIGITS[1]]], "logprobs": [[-0.5]], "version": 1}
    good = _record("s", out, PAIRS).segments[0]
    for bad, where in (
        ([[VOCAB_SIZE, 1.0]], "records[0].segments[0].logit_bias[0]"),
        ([[3, 1.0, 2]], "records[0].segments[0].logit_bias[0]"),
        ([[3, "x"]], "records[0].segments[0].logit_bias[0]"),
        ([[3, 1.0]] * 301, "records[0].segments[0].logit_bias"),
    ):
        plain = {"session_id": "s", "segments": [{**good.__dict__, "logit_bias": bad}]}
        with pytest.raises(TrajectoryError) as exc:
            record = TrajectoryRecord.from_plain(plain, "records[0]")
            group_from_trajectories(GroupTicket(0, 0, 0), [record], [1.0], max_tokens=32, vocab_size=VOCAB_SIZE)
        assert exc.value.field == where
    group = group_from_trajectories(
        GroupTicket(0, 0, 0), [_record("s", out, PAIRS)], [1.0], max_tokens=32, vocab_size=VOCAB_SIZE
    )
    with pytest.raises(ValueError, match="vocab_size"):
        batch_from_groups([group])
    for choice in (-1, True, "0", 5000):
        with pytest.raises(TrajectoryError) as exc:
            TrajectoryRecord.from_plain({"session_id": "s", "segments": [{**good.__dict__, "choice": choice}]}, "r")
        assert exc.value.field == "r.segments[0].choice"
    skipping = {"session_id": "s", "segments": [{**good.__dict__, "choice": k} for k in (0, 2)]}
    with pytest.raises(TrajectoryError, match="one segment per choice"):
        split_choices(TrajectoryRecord.from_plain(skipping))
    both = {"session_id": "s", "segments": [{**good.__dict__, "choice": k} for k in (0, 1)]}
    assert [r.session_id for r in split_choices(TrajectoryRecord.from_plain(both))] == ["s#0", "s#1"]
