"""The chat vocabulary and template (agents/chat.py): pure, no torch."""

from __future__ import annotations

import pytest

from agents.chat import (
    CHAT_VOCAB,
    STOP,
    VOCAB_SIZE,
    EncodeError,
    TemplateError,
    decode,
    encode,
    render,
)


def test_vocabulary_is_the_specials_then_printable_ascii_and_newline() -> None:
    assert CHAT_VOCAB[:5] == ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>")
    assert CHAT_VOCAB[5:] == tuple(chr(c) for c in range(32, 127)) + ("\n",)
    assert VOCAB_SIZE == 5 + 95 + 1 and CHAT_VOCAB[STOP] == "<|end|>"


def test_encode_decode_round_trip_printable_text() -> None:
    text = "Hello, world!\n  x = [1, 2] {ok} ~`|<>"
    assert decode(encode(text)) == text
    assert len(encode(text)) == len(text)


def test_special_text_encodes_to_one_id_but_its_characters_decode_the_same() -> None:
    assert encode("<|end|>") == [STOP]
    chars = [encode(c)[0] for c in "<|end|>"]  # what a model may emit, character by character
    assert decode(chars) == "<|end|>" and encode(decode(chars)) == [STOP] != chars
    assert encode("<|nope|>") == [encode(c)[0] for c in "<|nope|>"]  # not a special: characters


def test_non_encodable_character_names_its_position() -> None:
    with pytest.raises(EncodeError) as err:
        encode("ok\té")
    assert err.value.index == 2 and "'\\t'" in str(err.value)
    with pytest.raises(ValueError):
        decode([VOCAB_SIZE])
    with pytest.raises(ValueError):
        decode([-1])


def test_render_is_role_content_end_per_message_then_assistant() -> None:
    msgs = [{"role": "system", "content": "be"}, {"role": "user", "content": "hi"}]
    ids = render(msgs)
    assert ids == [0, *encode("be"), STOP, 1, *encode("hi"), STOP, 2]
    assert render(msgs, add_generation_prompt=False) == ids[:-1]
    assert decode(ids) == "<|system|>be<|end|><|user|>hi<|end|><|assistant|>"


def test_render_refuses_a_bad_message_naming_its_index() -> None:
    with pytest.raises(TemplateError) as err:
        render([{"role": "user", "content": "fine"}, {"role": "user", "content": "caf\u00e9"}])
    assert err.value.index == 1 and err.value.field == "content" and "messages[1].content" in str(err.value)
    with pytest.raises(TemplateError) as err:
        render([{"role": "wizard", "content": "x"}], first_index=4)
    assert err.value.index == 4 and err.value.field == "role"
