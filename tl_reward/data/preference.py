"""Preference pairs: one shared dialogue, a chosen and a rejected final reply."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tl_reward.data.conversation import Conversation, Message, as_conversation
from tl_reward.errors import EmptyResponseError
from tl_reward.results import result_type

SIDES = ("chosen", "rejected")


@result_type
@dataclass(frozen=True)
class PreferencePair:
    """A prompt (the shared dialogue so far) with a chosen and a rejected assistant reply.

    Example:
        >>> pair = PreferencePair.from_prompt("Is the sky blue?", "Yes, usually.", "No.")
        >>> pair.chosen_conversation()[-1]
        {'role': 'assistant', 'content': 'Yes, usually.'}
    """

    prompt: Conversation
    chosen: str
    rejected: str
    #: anything known about the pair; ``meta["source"]`` names where it was read from (the
    #: command line's ``path:line``), which errors about it give instead of its index.
    meta: dict[str, object] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", as_conversation(self.prompt))
        for name in ("chosen", "rejected"):
            if not str(getattr(self, name)).strip():
                raise EmptyResponseError(
                    f"the {name} response is empty; every pair needs two non-empty replies",
                    "drop the pair, or pass skip_invalid=True to the loader")

    @classmethod
    def from_prompt(cls, prompt: str | Conversation, chosen: str, rejected: str,
                    system: str | None = None) -> PreferencePair:
        """Build a pair from a user prompt string (one turn) or the conversation so far."""
        msgs: Conversation = [] if system is None else [Message(role="system", content=system)]
        msgs += [Message(role="user", content=prompt)] if isinstance(prompt, str) else prompt
        return cls(prompt=msgs, chosen=chosen, rejected=rejected)

    def row_name(self, side: str, index: int) -> str:
        """What errors call one reply of this pair, the ``index``-th the caller was given:
        ``pair 3 (rejected reply)``, or ``data.jsonl:7 (rejected reply)`` when
        ``meta["source"]`` says where it was read from."""
        return f"{self.meta.get('source') or f'pair {index}'} ({side} reply)"

    def chosen_conversation(self) -> Conversation:
        """The prompt followed by the chosen reply."""
        return [*self.prompt, Message(role="assistant", content=self.chosen)]

    def rejected_conversation(self) -> Conversation:
        """The prompt followed by the rejected reply."""
        return [*self.prompt, Message(role="assistant", content=self.rejected)]


def pair_rows(pairs: Sequence[PreferencePair]) -> tuple[list[Conversation], list[str]]:
    """Each pair's chosen then rejected conversation (rows ``2k`` and ``2k + 1``) and the name
    errors give each row (:meth:`PreferencePair.row_name`): how pairs become scored rows."""
    rows: list[Conversation] = []
    names: list[str] = []
    for k, p in enumerate(pairs):
        rows += [p.chosen_conversation(), p.rejected_conversation()]
        names += [p.row_name(side, k) for side in SIDES]
    return rows, names
