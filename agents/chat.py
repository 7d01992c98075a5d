"""The chat vocabulary and template of the built-in policy (pure: no torch, no I/O).

Ids 0..4 are the special tokens `<|system|>`, `<|user|>`, `<|assistant|>`, `<|tool|>`, `<|end|>`; then every
printable ASCII character (32..126) and "\\n", one id each. `encode` matches the specials greedily first, so the
TEXT "<|end|>" is the one special id, while the model may also emit the seven character ids that decode to the
same text: re-encoding returned text can give other ids than the ones generated, which is why trajectories keep
the recorded ids (agents.trajectory) and never re-tokenize.

Template: each message is its role's special, its content, then `<|end|>`; a generation prompt adds
`<|assistant|>`. The model's turn ends when it samples `<|end|>` (`STOP`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SPECIALS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>")
CHARS = tuple(chr(c) for c in range(32, 127)) + ("\n",)
CHAT_VOCAB: tuple[str, ...] = SPECIALS + CHARS
VOCAB_SIZE = len(CHAT_VOCAB)
ROLE_IDS = {"system": 0, "user": 1, "assistant": 2, "tool": 3}
STOP = SPECIALS.index("<|end|>")
ASSISTANT = ROLE_IDS["assistant"]
_CHAR_IDS = {ch: len(SPECIALS) + i for i, ch in enumerate(CHARS)}


class EncodeError(ValueError):
    """Text holds a character outside the vocabulary; `index` is its position in the text."""

    def __init__(self, char: str, index: int) -> None:
        super().__init__(f"character {char!r} at position {index} is not in the chat vocabulary (printable ASCII, \\n)")
        self.char, self.index = char, index


def encode(text: str) -> list[int]:
    """Text to ids: a special token's text is its one id; every other character its own id (else EncodeError)."""
    ids: list[int] = []
    i = 0
    while i < len(text):
        if text[i] == "<":
            special = next((s for s in SPECIALS if text.startswith(s, i)), None)
            if special is not None:
                ids.append(SPECIALS.index(special))
                i += len(special)
                continue
        tid = _CHAR_IDS.get(text[i])
        if tid is None:
            raise EncodeError(text[i], i)
        ids.append(tid)
        i += 1
    return ids


def decode(ids: Sequence[int]) -> str:
    """Ids to text (a special id becomes its text); ValueError for an id outside the vocabulary."""
    try:
        return "".join(CHAT_VOCAB[i] if i >= 0 else _bad(i) for i in ids)
    except IndexError:
        raise ValueError(f"token id outside the chat vocabulary of {VOCAB_SIZE}") from None


def _bad(i: int) -> str:
    raise ValueError(f"token id {i} outside the chat vocabulary of {VOCAB_SIZE}")


class TemplateError(ValueError):
    """A message cannot be rendered; `index` is the message's position, `field` what is wrong with it."""

    def __init__(self, index: int, field: str, why: str) -> None:
        super().__init__(f"messages[{index}].{field}: {why}")
        self.index, self.field = index, field


def render_message(role: str, content: str, index: int = 0) -> list[int]:
    """One message: role special, content, `<|end|>`."""
    if role not in ROLE_IDS:
        raise TemplateError(index, "role", f"unknown role {role!r} (known: {', '.join(ROLE_IDS)})")
    try:
        body = encode(content)
    except EncodeError as exc:
        raise TemplateError(index, "content", str(exc)) from None
    return [ROLE_IDS[role], *body, STOP]


def render(messages: Sequence[Any], add_generation_prompt: bool = True, first_index: int = 0) -> list[int]:
    """Messages ({"role", "content"} dicts or objects with those attributes) to ids; `<|assistant|>` last when
    `add_generation_prompt`. `first_index` numbers the messages in errors (a later turn renders a suffix)."""
    ids: list[int] = []
    for i, m in enumerate(messages):
        role, content = (m["role"], m["content"]) if isinstance(m, dict) else (m.role, m.content)
        ids += render_message(role, content, first_index + i)
    if add_generation_prompt:
        ids.append(ASSISTANT)
    return ids
