"""The token ids around a single-token assistant response, found at the id level.

For a prompt, the chat template puts a response between a fixed ``prefix`` (system turn, user
turn, assistant header) and a fixed ``suffix`` (end of turn). A vocabulary sweep scores every
token ``v`` as the whole response, ``prefix + [v] + suffix``, without ever decoding ``v`` to a
string. Prefix and suffix are found by templating the conversation straight to ids with two
different placeholder replies and checking that everything but the placeholder agrees.

Example:
    >>> t = response_template(model.tokenizer, "What, in one word, is the greatest thing ever?")
    >>> t.ids(1234)  # prefix + [1234] + suffix
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tl_reward.data.conversation import Conversation, Message, as_conversation
from tl_reward.data.solutions import as_reply_pair
from tl_reward.errors import TLRewardError
from tl_reward.model.inputs import template_ids
from tl_reward.results import ShortRepr

Prompt = str | Sequence[Mapping[str, str]]

# Placeholder replies; each must tokenise on its own, as in context, to find the response span.
_PLACEHOLDERS = ("A", "B", "x", "Z", "Hello", "OK")


@dataclass(frozen=True, repr=False)
class ResponseTemplate(ShortRepr):
    """``prefix + [v] + suffix``: a prompt with a one-token assistant response ``v``.

    Attributes:
        conversation: the prompt as messages (ending with a user turn).
        prefix: ids before the response (BOS, earlier turns, assistant header).
        suffix: ids after the response (end of turn and whatever the template closes with).
    """

    conversation: Conversation
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]

    def ids(self, token_id: int) -> list[int]:
        """The full sequence with ``token_id`` as the whole assistant response."""
        return [*self.prefix, int(token_id), *self.suffix]

    @property
    def response_position(self) -> int:
        """Index of the response token in :meth:`ids`."""
        return len(self.prefix)


def prompt_conversation(prompt: Prompt) -> Conversation:
    """A user string or a message list (ending in a user turn) as a conversation."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise TLRewardError("the prompt is empty; pass the question the responses answer")
        return [Message(role="user", content=prompt)]
    conv = as_conversation(prompt)
    if not conv or conv[-1]["role"] == "assistant":
        raise TLRewardError(
            "a sweep prompt must end with a user (or system) turn: the swept token is the "
            "assistant's reply; drop the final assistant message"
        )
    return conv


def response_template(tokenizer: Any, prompt: Prompt, suffix_ids: Sequence[int] = ()
                      ) -> ResponseTemplate:
    """Find ``prefix`` and ``suffix`` around a one-token assistant reply to ``prompt``.

    The prefix is the template with the generation prompt; the suffix is what follows the
    placeholder reply, then ``suffix_ids`` (a reward model's :attr:`suffix_ids`; use
    :meth:`HookedRewardModel.response_template`). Ids come from
    :func:`~tl_reward.model.inputs.template_ids` (one BOS), so ``prefix + [v] + suffix`` is
    exactly what ``model.encode`` builds for that reply. Two placeholders must give the same
    prefix and suffix, so a template that rewrites the reply (or merges it with its
    neighbours) is reported, not guessed.
    """
    conv = prompt_conversation(prompt)
    gen = template_ids(tokenizer, conv, add_generation_prompt=True)
    fulls = [(text, template_ids(tokenizer, [*conv, Message(role="assistant", content=text)],
                                 False))
             for text in _PLACEHOLDERS]
    a, b = fulls[0][1], fulls[1][1]
    common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                  min(len(a), len(b)))
    found: list[tuple[list[int], list[int]]] = []
    for text, full in fulls:
        ph = [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
        # the generation prompt is the prefix when the template extends it; else the ids
        # that every templated reply shares
        prefix = gen if full[: len(gen)] == gen else full[:common]
        end = len(prefix) + len(ph)
        if full[len(prefix):end] == ph:  # the placeholder where the reply goes
            found.append((prefix, full[end:]))
        if len(found) == 2:
            break
    if len(found) < 2 or found[0] != found[1]:
        raise TLRewardError(
            "could not isolate a one-token reply in this chat template (the template rewrites "
            "or merges the reply with its neighbours); build the sequences yourself and score "
            "them with model.rewards"
        )
    prefix, suffix = found[0]
    return ResponseTemplate(conv, tuple(prefix), (*suffix, *(int(t) for t in suffix_ids)))


def step_template(model: Any, solution: Any, step: int, position: int | None = None
                  ) -> ResponseTemplate:
    """A process reward model's step ``step`` of ``solution`` with one token inserted before
    the step's ``position``-th id (0: its first; default: just before its tag), up to that
    step's tag: ``prefix + [v] + suffix`` is read at the tag, so a sweep ranks the single
    tokens that raise or lower that step's reward (the prefix cache still applies)."""
    from tl_reward.model.steps import step_indices, step_spans

    (e,), _ = model.encode_steps([solution])
    k = step_indices(e, step)[0]
    start, end = step_spans(e)[1 + k]
    tag = end - 1
    p = tag - start if position is None else int(position)
    if not 0 <= p <= tag - start:
        raise TLRewardError(f"position {position} is outside step {k}, which has {tag - start} "
                            f"ids before its tag (positions 0..{tag - start})")
    return ResponseTemplate(_solution_conversation(solution), tuple(e.ids[: start + p]),
                            tuple(e.ids[start + p : end]))


def _solution_conversation(solution: Any) -> Conversation:
    """The messages of a solution given as a pair or conversation; ``[]`` for text or ids."""
    from tl_reward.model.inputs import EncodedInput, input_kind, input_messages

    item = as_reply_pair(solution)
    if isinstance(item, EncodedInput) or input_kind(item) in ("text", "ids"):
        return []
    return as_conversation(input_messages(item))
