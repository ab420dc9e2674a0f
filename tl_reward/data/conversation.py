"""Chat messages: the one conversation format every loader and model call speaks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict


class Message(TypedDict):
    """One chat turn, as HF chat templates expect it."""

    role: str
    content: str


Conversation = list[Message]


def as_conversation(messages: Sequence[Mapping[str, str]]) -> Conversation:
    """Validate and copy a list of ``{"role", "content"}`` mappings."""
    out: Conversation = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise TypeError(f"message {i} must be a mapping with 'role' and 'content' keys, "
                            f"got {m!r}")
        out.append(Message(role=str(m["role"]), content=str(m["content"])))
    return out


def is_conversation(obj: object) -> bool:
    """True for a non-empty list of role/content mappings."""
    return (isinstance(obj, Sequence) and not isinstance(obj, str) and len(obj) > 0
            and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in obj))
