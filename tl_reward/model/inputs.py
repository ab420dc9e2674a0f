"""Every kind of reward-model input, turned into token ids once and batched with a mask.

Inputs: a string (tokenised as the model's tokenizer does, special tokens included); a chat
conversation (a list of ``{"role", "content"}`` messages, through the chat template straight
to ids, never via a string, so BOS is never duplicated); a ``(prompt, response)`` pair
(prompt a string or a conversation); or token ids (list or 1-D tensor).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from jaxtyping import Int
from tqdm.auto import tqdm

from tl_reward.data.conversation import Conversation, Message, as_conversation, is_conversation
from tl_reward.data.solutions import as_reply_pair, is_steps_input
from tl_reward.errors import (
    EmptyResponseError,
    MissingPadTokenError,
    MissingTokenizerError,
    TLRewardError,
    check_tokens,
)

RewardInput = (
    str
    | Sequence[Mapping[str, str]]
    | tuple[str | Sequence[Mapping[str, str]], str]
    | Sequence[int]
    | torch.Tensor
)


def is_single(inputs: Any) -> bool:
    """Whether ``inputs`` is one input (text, ids, a pair, a conversation, a solution as
    ``(question, [steps])`` or an :class:`EncodedInput`), not a list of them."""
    if isinstance(inputs, EncodedInput):
        return True
    if is_steps_input(inputs):
        return True
    if isinstance(inputs, (str, torch.Tensor)):
        return isinstance(inputs, str) or inputs.ndim == 1
    if isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[1], str):
        return True
    if isinstance(inputs, Sequence) and inputs and isinstance(inputs[0], dict):
        return True
    return isinstance(inputs, Sequence) and bool(inputs) and isinstance(inputs[0], int)


def as_items(inputs: Any) -> list[Any]:
    """``inputs`` as a list of single inputs (see :func:`is_single`)."""
    return [inputs] if is_single(inputs) else list(inputs)


@dataclass(frozen=True)
class EncodedInput:
    """Token ids of one input and, when known, where the final response starts and how the
    user's inputs name it (``name``, set by :func:`encode_inputs`; what errors about it say)."""

    ids: list[int]
    response_start: int | None = None
    name: str | None = field(default=None, compare=False)
    #: a process reward model's step tags (indices into ``ids``) and the steps' texts
    #: (:mod:`~tl_reward.model.steps`); empty for an outcome input
    read_at: tuple[int, ...] = ()
    steps: tuple[str, ...] = ()
    #: the step this input ends at (a step prefix), else ``None``
    step: int | None = None


def encode_inputs(model: Any, items: Sequence[Any], names: Sequence[str] | None = None
                  ) -> list[EncodedInput]:
    """``model.encode`` of each item, named ``names[i]`` (default ``input i``: its place in
    ``items``), so that an error about a row, here or when it is batched (:func:`collate`),
    names the input the user gave, whatever order the rows are batched in."""
    if names is not None and len(names) != len(items):
        raise TLRewardError(f"got {len(names)} names for {len(items)} inputs; give one each")
    out = []
    for i, item in enumerate(items):
        name = f"input {i}" if names is None else str(names[i])
        try:
            out.append(replace(model.encode(item), name=name))
        except TLRewardError as err:
            err.args = (f"{name}: {err}", *err.args[1:])
            raise
    return out


def template_ids(tokenizer: Any, messages: Conversation, add_generation_prompt: bool) -> list[int]:
    """The chat template's ids for ``messages`` (never via a string), with :func:`one_bos`
    applied: the one place a conversation becomes ids."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise TLRewardError(
            "this tokenizer has no chat template, so conversations cannot be scored; set "
            "tokenizer.chat_template, or pass strings or token ids instead"
        )
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=True
    )
    ids = out["input_ids"]
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return one_bos(tokenizer, [int(t) for t in ids])


def one_bos(tokenizer: Any, ids: list[int]) -> list[int]:
    """Template ids with the BOS a model saw in training: exactly one leading BOS when the
    tokenizer adds BOS on encoding, the template's ids untouched otherwise.

    RMs trained from a string template (Skywork-Reward-V2's model card: template to a string,
    strip a leading ``bos_token``, then ``tokenizer(text)``) saw one BOS: the tokenizer's. A
    template that writes ``{{ bos_token }}`` already gives it; one that does not gets it here;
    a duplicated one is collapsed. Where the tokenizer adds no BOS (Qwen3: none; SmolLM2, whose
    ``bos_token`` is ``<|im_start|>`` and opens every turn) nothing is stripped.
    """
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return ids
    added = tokenizer("", add_special_tokens=True)["input_ids"]
    if not added or added[0] != bos:
        return ids
    return [bos, *itertools.dropwhile(lambda t: t == bos, ids)]


def is_blank(text: str) -> bool:
    """Whether a reply or text has nothing to score: empty or only whitespace (the encoders
    refuse it with :class:`~tl_reward.errors.EmptyResponseError`)."""
    return not text.strip()


def encode_conversation(tokenizer: Any, messages: Conversation) -> EncodedInput:
    """Ids of a conversation; if it ends with an assistant turn, where that reply starts."""
    if messages[-1]["role"] == "assistant" and is_blank(messages[-1]["content"]):
        raise EmptyResponseError(
            "the final assistant response is empty; a reward model needs a non-empty reply "
            "to score"
        )
    ids = template_ids(tokenizer, messages, add_generation_prompt=False)
    start = None
    if messages[-1]["role"] == "assistant" and len(messages) > 1:
        prefix = template_ids(tokenizer, messages[:-1], add_generation_prompt=True)
        if ids[: len(prefix)] == prefix:
            start = len(prefix)
    return EncodedInput(ids, start)


def _need_tokenizer(tokenizer: Any, what: str) -> None:
    if tokenizer is None:
        raise MissingTokenizerError(
            f"{what} need a tokenizer, and this model was loaded without one (e.g. a checkpoint "
            "saved without tokenizer files); load it with tokenizer=AutoTokenizer."
            "from_pretrained(<the base model>) or pass token ids instead"
        )


def is_token_ids(item: Any) -> bool:
    """True for token-id inputs: a 1-D integer tensor, or a list or tuple of ints."""
    if isinstance(item, torch.Tensor):
        return not item.is_floating_point() and not item.is_complex()
    return (isinstance(item, Sequence) and not isinstance(item, str) and bool(item)
            and all(isinstance(t, int) and not isinstance(t, bool) for t in item))


def input_kind(item: Any) -> str:
    """What :func:`encode` reads ``item`` as: ``"ids"``, ``"text"``, ``"pair"`` (a
    ``(prompt, response)`` tuple) or ``"conversation"``; an error for anything else."""
    if is_token_ids(item):
        if isinstance(item, torch.Tensor) and item.ndim != 1:
            raise TLRewardError("a token tensor input must be 1-D; pass a batch as a list")
        return "ids"
    if isinstance(item, torch.Tensor):
        raise TLRewardError("a token tensor input must hold integer ids")
    if isinstance(item, str):
        return "text"
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], str):
        return "pair"
    if is_conversation(item):
        return "conversation"
    if is_steps_input(item):
        raise TLRewardError(
            "(question, [steps]) is a process reward model's input, and this model has no step "
            "format; load a PRM with its step tag (from_pretrained(..., step_tag=...)) or pass "
            "(question, reply)")
    raise TypeError(
        "unsupported input: pass a string, a list of {'role','content'} messages, a "
        f"(prompt, response) tuple, or token ids; got {type(item).__name__}"
    )


def input_messages(item: Any) -> Conversation:
    """The conversation a ``(prompt, response)`` or conversation input is scored as."""
    if input_kind(item) == "conversation":
        return as_conversation(item)
    prompt = ([Message(role="user", content=item[0])] if isinstance(item[0], str)
              else as_conversation(item[0]))
    return [*prompt, Message(role="assistant", content=item[1])]


def encode(tokenizer: Any, item: RewardInput, suffix_ids: Sequence[int] = ()) -> EncodedInput:
    """Token ids for any supported input kind.

    ``suffix_ids`` (InternLM2's reward token) follow every text, pair or conversation; token-id
    inputs (a tensor, list or tuple of ints) are taken exactly as given.
    """
    if isinstance(item, EncodedInput):  # already built (a step prefix): taken as it is
        return item
    kind = input_kind(item)
    if kind == "ids":
        ids = item.tolist() if isinstance(item, torch.Tensor) else item
        return EncodedInput([int(t) for t in ids])  # type: ignore[union-attr]
    _need_tokenizer(tokenizer, {"text": "strings", "pair": "(prompt, response) pairs",
                                "conversation": "conversations"}[kind])
    if kind == "text":
        if is_blank(item):  # type: ignore[arg-type]
            raise EmptyResponseError("the input text is empty")
        out = EncodedInput([int(t) for t in tokenizer(item, add_special_tokens=True)["input_ids"]])
    else:
        out = encode_conversation(tokenizer, input_messages(item))
    return EncodedInput([*out.ids, *(int(t) for t in suffix_ids)], out.response_start)


#: The text columns of :func:`input_texts`, in the order tables show them.
TEXT_COLUMNS = ("prompt", "response", "text")


def input_texts(items: Sequence[Any], tokenizer: Any = None) -> dict[str, list[str | None]]:
    """The inputs' texts by column, for tables: ``prompt`` and ``response`` for a
    ``(prompt, response)`` input or a conversation (its last user turn and final assistant
    reply), ``text`` for a string or token ids (decoded, special tokens kept, so it shows what
    was scored; ``None`` without a tokenizer, where the row's place joins it back). ``None``
    where an input has no such text; a column only where some input has one."""
    rows: list[dict[str, str | None]] = []
    for item in items:
        if isinstance(item, EncodedInput):
            item = item.ids
        else:
            item = as_reply_pair(item)  # a solution's steps as its reply
        kind = input_kind(item)
        if kind == "ids":
            ids = item.tolist() if isinstance(item, torch.Tensor) else list(item)
            rows.append({"text": None if tokenizer is None else tokenizer.decode(ids)})
        elif kind == "text":
            rows.append({"text": item})
        else:
            conv = input_messages(item)
            users = [m["content"] for m in conv if m["role"] == "user"]
            rows.append({"prompt": users[-1] if users else None,
                         "response": conv[-1]["content"] if conv[-1]["role"] == "assistant"
                         else None})
    return {c: [r.get(c) for r in rows] for c in TEXT_COLUMNS
            if any(r.get(c) is not None for r in rows)}


@dataclass
class RewardBatch:
    """A padded batch of token ids with its attention mask.

    Attributes:
        tokens: ``[batch, pos]`` ids, padded with ``pad_token_id``.
        attention_mask: ``[batch, pos]``, 1 on real tokens.
        lengths: real length of each row.
        padding_side: ``"right"`` or ``"left"``.
        response_starts: per row, the index (in the unpadded ids) where the final response
            starts, or ``None`` when unknown.
        pooled: per row, the padded position the reward is read at (set by
            :meth:`HookedRewardModel.build`; ``None`` for a batch made without a model).
    """

    tokens: Int[torch.Tensor, "batch pos"]
    attention_mask: Int[torch.Tensor, "batch pos"]
    lengths: Int[torch.Tensor, " batch"]
    padding_side: str
    response_starts: list[int | None]
    pooled: Int[torch.Tensor, " batch"] | None = None

    def offsets(self) -> Int[torch.Tensor, " batch"]:
        """Index in the padded row of each sequence's first real token."""
        if self.padding_side == "right":
            return torch.zeros_like(self.lengths)
        return self.tokens.shape[1] - self.lengths

    def position_classes(self) -> Int[torch.Tensor, "batch pos"]:
        """Each position's class for mean ablation: 0 prompt (before the response start),
        1 reply (every other real token), 2 the pooled reward token, -1 padding. A row with no
        known response start is prompt up to its pooled token."""
        if self.pooled is None:
            raise TLRewardError("position classes need the pooled positions (model.build)")
        pos = torch.arange(self.tokens.shape[1], device=self.tokens.device)[None]
        rel = pos - self.offsets().to(pos.device)[:, None]
        starts = torch.tensor([self.tokens.shape[1] if s is None else s
                               for s in self.response_starts], device=pos.device)
        out = torch.where(rel < starts[:, None], 0, 1)
        out[pos.expand_as(out) == self.pooled.to(pos.device)[:, None]] = 2
        return out.masked_fill(self.attention_mask == 0, -1)

    def to(self, device: torch.device | str) -> RewardBatch:
        return RewardBatch(self.tokens.to(device), self.attention_mask.to(device),
                           self.lengths.to(device), self.padding_side, self.response_starts,
                           None if self.pooled is None else self.pooled.to(device))


def collate(
    encoded: Sequence[EncodedInput],
    pad_token_id: int | None,
    padding_side: str = "right",
    n_ctx: int | None = None,
    d_vocab: int | None = None,
) -> RewardBatch:
    """Pad encoded inputs into a batch, checking context length and vocabulary."""
    if padding_side not in ("right", "left"):
        raise TLRewardError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    if not encoded:
        raise TLRewardError("no inputs to score")
    lengths = [len(e.ids) for e in encoded]
    for i, e in enumerate(encoded):
        check_tokens(e.ids, e.name or f"row {i} of the batch", n_ctx, d_vocab)
    width = max(lengths)
    if pad_token_id is None and len(set(lengths)) > 1:
        raise MissingPadTokenError(
            "inputs of different lengths need padding but this model has no pad token; set "
            "tokenizer.pad_token (and model pad_token_id) or score one input at a time"
        )
    pad = 0 if pad_token_id is None else pad_token_id
    tokens = torch.full((len(encoded), width), pad, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, e in enumerate(encoded):
        sl = slice(0, len(e.ids)) if padding_side == "right" else slice(width - len(e.ids), width)
        tokens[i, sl] = torch.tensor(e.ids, dtype=torch.long)
        mask[i, sl] = 1
    return RewardBatch(tokens, mask, torch.tensor(lengths), padding_side,
                       [e.response_start for e in encoded])


def input_batches(model: Any, encoded: Sequence[EncodedInput], batch_size: int, desc: str = "",
                  progress: bool | None = False) -> Iterator[RewardBatch]:
    """``encoded`` in right-padded batches of ``batch_size`` (``model.collate``), with a
    progress bar when ``progress`` is True (``None``: when there are more than 4 batches)."""
    starts = range(0, len(encoded), batch_size)
    show = progress if progress is not None else len(starts) > 4
    for s in tqdm(starts, disable=not show, desc=desc, unit="batch"):
        yield model.collate(encoded[s : s + batch_size], "right")


@torch.no_grad()
def cached_batches(model: Any, encoded: Sequence[EncodedInput], batch_size: int,
                   names: Collection[str], desc: str = "", progress: bool | None = False,
                   **run_kwargs: Any) -> Iterator[tuple[RewardBatch, Any]]:
    """:func:`input_batches`, each with its activations at the hooks ``names`` (a no-grad
    ``run_with_cache``; ``run_kwargs`` such as ``stop_at_layer`` go to it)."""
    for batch in input_batches(model, encoded, batch_size, desc, progress):
        yield batch, model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                          names_filter=lambda n: n in names, return_type=None,
                                          **run_kwargs)[1]
