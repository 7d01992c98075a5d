"""trainer/trajectories.py: a ragged group built from session-server records holds the recorded ids (never
the text re-encoded), their log-probs and per-token versions, mask 0 on prompt and tool tokens, and so does the
TrainBatch built from it; bad records are refused naming the field."""

from __future__ import annotations

import math

import pytest
import torch

from agents.sessions import SessionState, max_new_tokens
from agents.trajectory import Trajectory
from trainer.agent_episodes import session_tokens
from trainer.algorithm import PAD_ID, batch_from_groups
from trainer.config import TrainConfig
from trainer.episodes import GroupTicket
from trainer.learner import Learner
from trainer.trajectories import TrajectoryError, TrajectoryRecord, TrajectorySegment, group_from_trajectories

torch.set_num_threads(1)

# A 12-id text vocabulary with the rule of the session server's chat vocabulary (agents/chat.py on branch
# agents-server): a special token's text encodes to its one id first, while the model can also emit the
# characters that spell it. 12 ids: the default policy's vocabulary size, so the learner can train on it.
SPECIALS = ("<|end|>", "<|user|>", "<|tool|>")
CHARS = ("<", "|", ">", "e", "n", "d", "7", "=", "+")
TEXT_VOCAB = SPECIALS + CHARS
END, USER, TOOL = 0, 1, 2
ID = {ch: len(SPECIALS) + i for i, ch in enumerate(CHARS)}


def encode(text: str) -> list[int]:
    out, i = [], 0
    while i < len(text):
        special = next((k for k, s in enumerate(SPECIALS) if text.startswith(s, i)), None)
        if special is not None:
            out.append(special)
            i += len(SPECIALS[special])
        else:
            out.append(ID[text[i]])
            i += 1
    return out


def decode(ids: list[int]) -> str:
    return "".join(TEXT_VOCAB[i] for i in ids)


SPELLED_END = [ID[c] for c in "<|end|>"]  # seven character ids whose text is "<|end|>"


def seg(request_id: str, prompt: list[int], completion: list[int], version: int, finish: str = "stop"):
    logprobs = [-0.1 * (i + 1) - version / 100 for i in range(len(completion))]
    return TrajectorySegment(request_id, prompt, completion, logprobs, [version] * len(completion), finish, "engine-1")


def records() -> list[TrajectoryRecord]:
    # Episode 0: one request; the policy spelled "<|end|>" out in characters after a 7 (the turn hit max_tokens).
    one = TrajectoryRecord(
        "w0:g9:0", segments=[seg("w0:g9:0/r0", [USER, ID["7"], ID["="]], [ID["7"], *SPELLED_END], 3, "length")]
    )
    # Episode 1: two requests, a tool reply between them fed at the second, and a publication in between.
    two = TrajectoryRecord(
        "w0:g9:1",
        segments=[
            seg("w0:g9:1/r0", [USER, ID["7"], ID["+"], ID["="]], [ID["7"], END], 3),
            seg("w0:g9:1/r1", [TOOL, ID["7"], END], [ID["7"], ID["7"], END], 4),
        ],
    )
    return [one, two]


def test_a_group_from_records_holds_the_recorded_ids_logprobs_versions_and_mask() -> None:
    recs = records()
    completion = recs[0].segments[0].completion_ids
    assert encode(decode(completion)) == [ID["7"], END] != completion  # re-encoding the text gives other ids

    group = group_from_trajectories(GroupTicket(9, 2, 5), recs, [0.0, 1.0], max_tokens=16, vocab_size=12)
    assert (group.group_id, group.epoch, group.prompt_index, group.exact) == (9, 2, 5, [0.0, 1.0])
    r0, r1 = group.rows
    assert r0.tokens == [USER, ID["7"], ID["="], ID["7"], *SPELLED_END]  # as recorded, 11 tokens
    assert r0.mask == [0] * 3 + [1] * 8 and r0.versions == [-1] * 3 + [3] * 8
    assert r0.logprobs == [0.0] * 3 + recs[0].segments[0].logprobs
    assert r1.tokens == [USER, ID["7"], ID["+"], ID["="], ID["7"], END, TOOL, ID["7"], END, ID["7"], ID["7"], END]
    assert r1.mask == [0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]  # prompt and tool reply: no loss
    assert r1.versions == [-1] * 4 + [3, 3] + [-1] * 3 + [4, 4, 4]  # each token: its request's version
    assert r1.token_request_ids()[4:] == ["w0:g9:1/r0"] * 2 + [""] * 3 + ["w0:g9:1/r1"] * 3
    assert [(t.start, t.end, t.finish_reason) for t in r1.turns] == [(4, 6, "stop"), (9, 12, "stop")]
    assert (r0.session, r1.session, group.versions, group.engines) == ("w0:g9:0", "w0:g9:1", [3, 4], ["engine-1"])

    batch = batch_from_groups([group])
    assert batch.tokens.tolist() == [r0.tokens + [PAD_ID], r1.tokens]  # recorded ids, the shorter row padded
    assert batch.tokens[0, 3:11].tolist() != encode(decode(completion))
    assert batch.mask.tolist() == [r0.mask[1:] + [0], [float(m) for m in r1.mask[1:]]]
    assert batch.versions.tolist() == [r0.versions[1:] + [-1], r1.versions[1:]]
    expected = torch.tensor([r0.logprobs[1:] + [0.0], r1.logprobs[1:]])
    assert torch.equal(batch.behaviour_logp, expected)  # the recorded floats, not recomputed

    learner = Learner(TrainConfig(device="cpu"))  # vocabulary 12, context 16
    stats = learner.train_step([group])
    assert stats["version"] == 1 and math.isfinite(stats["loss"]) and "logprob_diff_max" not in stats  # stale


def test_a_session_the_server_fills_to_its_last_token_is_trained_on() -> None:
    """The session server lets a session hold the context plus the engine's pending last token; the worker's bound
    takes that row (bounded by the context alone, it failed the group), and the policy trains on it."""
    block, prompt = 16, [USER, ID["7"], ID["+"], ID["7"], END, TOOL]
    n = max_new_tokens(SessionState(Trajectory(session_id="s", kind="internal")), prompt, None, block, "messages")
    rec = TrajectoryRecord("s", segments=[seg("s/r0", prompt, [ID["7"]] * (n - 1) + [END], 1)])
    assert len(prompt) + n == block + 1 == session_tokens(block)
    with pytest.raises(TrajectoryError, match="more than 16 tokens"):
        group_from_trajectories(GroupTicket(1, 0, 0), [rec], [1.0], max_tokens=block, vocab_size=12)
    group = group_from_trajectories(GroupTicket(1, 0, 0), [rec, rec], [0.0, 1.0], max_tokens=session_tokens(block),
                                    vocab_size=12)  # fmt: skip
    learner = Learner(TrainConfig(device="cpu"))  # vocabulary 12, context 16
    assert learner.model.block_size == block and len(group.rows[0].tokens) == block + 1
    assert math.isfinite(learner.train_step([group])["loss"])


def test_the_server_records_plain_dump_is_read_and_refused_when_malformed() -> None:
    dump = {
        "session_id": "s1",
        "kind": "internal",
        "engine": "engine-1",
        "state": "ended",
        "gone_reason": "",
        "segments": [
            {
                "request_id": "s1/r0",
                "prompt_ids": [USER, ID["7"]],
                "completion_ids": [ID["7"], END],
                "logprobs": [-0.5, -0.25],
                "versions": [2, 2],
                "finish_reason": "stop",
                "engine": "engine-1",
            }
        ],
    }
    record = TrajectoryRecord.from_plain(dump)
    assert record == TrajectoryRecord(
        "s1",
        "internal",
        "ended",
        [TrajectorySegment("s1/r0", [USER, ID["7"]], [ID["7"], END], [-0.5, -0.25], [2, 2], "stop", "engine-1")],
    )
    with pytest.raises(TrajectoryError, match=r"^record\.segments\[0\]\.tokens: unknown field"):
        TrajectoryRecord.from_plain({**dump, "segments": [{**dump["segments"][0], "tokens": []}]})
    with pytest.raises(TrajectoryError, match=r"^record\.segments\[0\]\.versions: missing"):
        TrajectoryRecord.from_plain(
            {**dump, "segments": [{k: v for k, v in dump["segments"][0].items() if k != "versions"}]}
        )
    with pytest.raises(TrajectoryError, match=r"^record\.session_id: must be a string"):
        TrajectoryRecord.from_plain({**dump, "session_id": 7})


def _refused(recs, rewards=(0.0, 1.0), **kw) -> str:
    with pytest.raises(TrajectoryError) as info:
        group_from_trajectories(GroupTicket(1, 0, 0), recs, list(rewards), **{"max_tokens": 16, "vocab_size": 12, **kw})
    return info.value.field


def test_bad_records_are_refused_naming_the_field() -> None:
    one, two = records()
    external = TrajectoryRecord(two.session_id, "external", "ended", two.segments)
    assert _refused([one, external]) == "records[1].kind"  # proxy sessions never enter training
    assert _refused([one, TrajectoryRecord("g", "internal", "gone", two.segments)]) == "records[1].state"
    assert _refused([one]) == "rewards"
    assert _refused([one, two], rewards=(0.0, float("nan"))) == "rewards[1]"
    assert _refused([one, two], max_tokens=11) == "records[1].segments"  # 12 tokens past the context
    assert _refused([one, two], vocab_size=10) == "records[0].segments[0].prompt_ids[2]"  # "=" is id 10
    short = TrajectorySegment("r", [USER], [ID["7"], END], [-0.1], [3, 3], "stop", "e")
    assert _refused([one, TrajectoryRecord("s", segments=[short])]) == "records[1].segments[0].logprobs"
    bad_version = TrajectorySegment("r", [USER], [ID["7"]], [-0.1], [-1], "stop", "e")
    assert _refused([one, TrajectoryRecord("s", segments=[bad_version])]) == "records[1].segments[0].versions[0]"
    positive = TrajectorySegment("r", [USER], [ID["7"]], [0.5], [1], "stop", "e")
    assert _refused([one, TrajectoryRecord("s", segments=[positive])]) == "records[1].segments[0].logprobs[0]"
    fed_only = TrajectorySegment("r", [USER], [], [], [], "disconnected", "e")
    assert _refused([one, TrajectoryRecord("s", segments=[fed_only])]) == "records[1].segments"  # nothing generated
    assert _refused([], rewards=()) == "records"
