"""Steps of a solution: where a process reward model (PRM) reads one reward per step.

A PRM reads a reward at a tag token after each step (Qwen2.5-Math-PRM: ``<extra_0>``;
Math-Shepherd: ``ки``; a value-head PRM at each step's closing token). A :class:`StepFormat`
names the tag and how a reply is cut into steps (at blank lines, as the published PRMs cut
it); :meth:`StepFormat.encode` builds the scored ids as every input is built (the chat
template as ids, one BOS) and finds each step's tag among those ids, never in a decoded string.

Attention is causal, so the reward at step ``k``'s tag depends only on the ids up to it: the
prefix ending at that tag (:func:`step_prefix`) is an outcome input whose pooled token is the
tag, and every analysis runs on it unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from tl_reward.data.solutions import STEP_BREAK, is_solution_pair, is_steps_input, split_steps
from tl_reward.errors import EmptyResponseError, TLRewardError
from tl_reward.model.inputs import EncodedInput, encode, input_kind, input_messages
from tl_reward.results import result_type

__all__ = ["StepFormat", "StepRow", "StepSpec", "check_step_end", "is_solution_pair",
           "is_steps_input", "select_steps", "step_indices", "step_prefix", "step_spans"]

#: ``step=`` of every analysis: an index (negative from the end), a list of them, every step
#: (``"all"``) or the last (``"last"``).
StepSpec = int | Sequence[int] | Literal["all", "last"]


@dataclass(frozen=True)
class StepFormat:
    """How a PRM's input marks its steps.

    Attributes:
        tag: the tag's text (one token of the tokenizer).
        tag_id: its id.
        split: what separates steps in an untagged reply (a blank line).
        join: text between a tag and the next step (``""`` for Qwen2.5-Math-PRM, ``"\\n"`` for
            Math-Shepherd's ``"step ки\\nstep ки"``).
        probability: how a step's linear reward becomes its probability: ``"sigmoid"`` (a
            two-class softmax, a good-against-bad token pair or a value head) or ``"none"``.
    """

    tag: str
    tag_id: int
    split: str = STEP_BREAK
    join: str = ""
    probability: Literal["sigmoid", "none"] = "sigmoid"

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, tag: str, **kwargs: Any) -> StepFormat:
        """The format whose tag is ``tag``, checked to be one token of ``tokenizer``."""
        if tokenizer is None:
            raise TLRewardError("a step tag needs the model's tokenizer to find its id; load "
                                "the model with tokenizer=")
        ids = tokenizer.encode(tag, add_special_tokens=False)
        if len(ids) != 1:
            raise TLRewardError(
                f"the step tag {tag!r} is {len(ids)} tokens {ids} for this tokenizer, and a PRM "
                "reads its reward at one tag token: pass the tag the model was trained with, or "
                "add it: tokenizer.add_special_tokens("
                f"{{'additional_special_tokens': [{tag!r}]}})")
        return cls(tag, int(ids[0]), **kwargs)

    def steps_of(self, reply: str) -> list[str]:
        """A reply's steps: cut at its tags when it holds any (pre-tagged text), else at
        :attr:`split`; surrounding whitespace stripped, empty steps dropped."""
        return split_steps(reply, self.tag if self.tag and self.tag in reply else self.split)

    def tagged(self, steps: Sequence[str]) -> str:
        """The reply a PRM scores: each step followed by the tag (and :attr:`join` between)."""
        return (self.tag + self.join).join(steps) + self.tag

    def encode(self, tokenizer: Any, item: Any, suffix_ids: Sequence[int] = ()) -> EncodedInput:
        """Ids of a solution with ``read_at`` (each step's tag) and ``steps`` (their texts).

        ``item``: ``(question, [steps])``, ``(question, reply)`` or a conversation (the final
        reply cut into steps, or already tagged), a tagged string, or ids (tags found as
        given); an :class:`EncodedInput` is taken as it is."""
        if isinstance(item, EncodedInput):
            return item
        if is_steps_input(item):
            steps = list(item[1])
            if not steps or not all(s.strip() for s in steps):
                raise EmptyResponseError("a solution needs at least one non-empty step")
            item = (item[0], self.tagged(steps))
        kind = input_kind(item)
        if kind == "ids":  # the tags where they stand
            base = encode(tokenizer, item, suffix_ids)
            read_at = tuple(i for i, t in enumerate(base.ids) if t == self.tag_id)
            return self._checked(replace(base, read_at=read_at), len(read_at), "these ids")
        if kind == "text":
            if self.tag not in item:
                raise TLRewardError(
                    f"this text has no step tag {self.tag!r}: pass (question, [steps]) or "
                    "(question, reply), which are tagged for you, or tag each step yourself")
            steps = [s.strip() for s in item.split(self.tag)[:-1] if s.strip()]
            base = encode(tokenizer, item, suffix_ids)
            return self._located(base, steps, 0)
        messages = input_messages(item)
        if messages[-1]["role"] != "assistant":
            raise TLRewardError("a PRM scores the steps of a final assistant reply; this "
                                "conversation ends with a user turn")
        steps = self.steps_of(messages[-1]["content"])
        if not steps:
            raise EmptyResponseError("the reply has no steps to score")
        messages = [*messages[:-1], {"role": "assistant", "content": self.tagged(steps)}]
        base = encode(tokenizer, messages, suffix_ids)
        return self._located(base, steps, base.response_start or 0)

    def _located(self, base: EncodedInput, steps: list[str], start: int) -> EncodedInput:
        read_at = tuple(i for i, t in enumerate(base.ids) if t == self.tag_id and i >= start)
        out = replace(base, read_at=read_at, steps=tuple(steps))
        return self._checked(out, len(steps), "the reply's steps")

    def _checked(self, e: EncodedInput, n_steps: int, what: str) -> EncodedInput:
        if not e.read_at:
            raise TLRewardError(f"{what} hold no step tag {self.tag!r} (id {self.tag_id}), so "
                                "no step reward can be read")
        if len(e.read_at) != n_steps:
            raise TLRewardError(
                f"{what} have {n_steps} steps but the tag id {self.tag_id} occurs "
                f"{len(e.read_at)} times in their ids: the tag {self.tag!r} merged with the "
                "text beside it or occurs inside a step; use the tag as a special token, or "
                "pass token ids")
        return e


def step_indices(e: EncodedInput, step: StepSpec) -> list[int]:
    """The steps ``step`` selects in one encoded solution (Python's counting for negatives);
    a clear error for an index out of range or a solution without tags."""
    n = len(e.read_at)
    who = e.name or "this input"
    if n == 0:
        raise TLRewardError(f"{who} has no step tags: it was not built by a process reward "
                            "model's step format (load the PRM with its step tag)")
    if isinstance(step, str):
        if step not in ("all", "last"):
            raise TLRewardError(f"step={step!r}: pass an index, a list, 'all' or 'last'")
        return list(range(n)) if step == "all" else [n - 1]
    items = [step] if isinstance(step, int) else list(step)
    out = []
    for k in items:
        if isinstance(k, bool) or not isinstance(k, int) or not -n <= k < n:
            raise TLRewardError(f"step {k!r} is out of range for {who}, which has {n} steps "
                                f"(indices 0..{n - 1}, or -{n}..-1 from the end)")
        out.append(k % n)
    return out


def step_spans(e: EncodedInput) -> list[tuple[int, int]]:
    """``[lo, hi)`` of the prompt (everything before the reply) and of each step (its tokens
    and its tag, ``hi = tag + 1``), as indices into ``e.ids``: the one place a step's ids
    are delimited."""
    start = e.response_start or 0
    ends = [t + 1 for t in e.read_at]
    return [(0, start), *zip([start, *ends[:-1]], ends, strict=True)]


def step_prefix(e: EncodedInput, k: int) -> EncodedInput:
    """The ids up to and including step ``k``'s tag: an input whose pooled token is that tag,
    named ``"<name> step k"``."""
    end = e.read_at[k] + 1
    return replace(e, ids=e.ids[:end], read_at=e.read_at[: k + 1], steps=e.steps[: k + 1],
                   name=f"{e.name or 'input'} step {k}", step=k)


@result_type
@dataclass(frozen=True)
class StepRow:
    """One selected step: the input it belongs to and its index there."""

    item: int
    step: int


def select_steps(encoded: Sequence[EncodedInput], step: StepSpec
                 ) -> tuple[list[EncodedInput], list[StepRow]]:
    """Step prefixes (:func:`step_prefix`) of each selected step of each input, in input
    order, with the (input, step) each one is."""
    prefixes, rows = [], []
    for i, e in enumerate(encoded):
        for k in step_indices(e, step):
            prefixes.append(step_prefix(e, k))
            rows.append(StepRow(i, k))
    return prefixes, rows


def check_step_end(model: Any, encoded: Sequence[EncodedInput]) -> None:
    """Refuse rows of a PRM that do not end at a step tag: their pooled token would not be a
    tag, so a reward would be read at a silently wrong position."""
    fmt = getattr(model, "step_format", None)
    if fmt is None:
        return
    bad = [e.name or f"row {i}" for i, e in enumerate(encoded)
           if not e.ids or e.ids[-1] != fmt.tag_id]
    if bad:
        raise TLRewardError(
            f"{', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} do not end at a step tag "
            f"{fmt.tag!r}: a process reward model reads a reward at each step's tag, so pass "
            "step= (an index, a list, 'all' or 'last') to the analysis, or "
            "model.at_steps(inputs, step) for the inputs")
