"""Generative judges as reward models: a causal LM asked a verdict question about a reply.

A judge's prompt puts the question and the reply into a verdict template (a user turn), closes
it with the chat template's generation prompt and an optional answer prefix, and reads the
logits at the last id, the *answer position*, where the judge's first generated token is
predicted. Its reward is

* a yes/no verdict: ``logit("Yes") - logit("No")`` there (two LM-head rows, ``head_weights
  [-1, 1]``: linear in the normed final residual, like a ``score`` layer), or
* a rating: the expected rating ``sum_i v_i softmax(l)_i`` over the rating tokens' logits
  ``l`` (:class:`~tl_reward.model.rating_head.RatingHead`, read through its exact local
  linearisation), HookedRewardModel only.

:func:`load_judge` (``HookedRewardModel.from_judge``, ``BridgeRewardModel.from_judge``) loads
one; :class:`JudgeFormat` is its ``input_format``, so every analysis builds its inputs as the
judge's prompts.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tl_reward.errors import EmptyResponseError, TLRewardError
from tl_reward.model.inputs import EncodedInput, input_kind, input_messages, template_ids
from tl_reward.model.response_template import ResponseTemplate, prompt_conversation

#: The default yes/no question (a user turn).
VERDICT_TEMPLATE = ("Question: {question}\n\nAnswer: {response}\n\n"
                    "Is the answer correct and helpful? Reply with Yes or No.")
#: The default rating question; ``{lowest}`` and ``{highest}`` become the first and last
#: rating words when the judge is loaded.
RATING_TEMPLATE = ("Question: {question}\n\nAnswer: {response}\n\n"
                   "Rate the answer's correctness and helpfulness from {lowest} to {highest}. "
                   "Reply with the number only.")
#: The default rating tokens, worth 1 to 9.
DIGIT_RATINGS: tuple[str, ...] = tuple("123456789")
#: The objective names of a yes/no judge's two LM-head rows (the score is yes minus no).
VERDICT_OBJECTIVES: tuple[str, str] = ("verdict_no", "verdict_yes")

#: Rating words worth their numbers, or ``{word: value}``.
Ratings = Sequence[str | int] | Mapping[str, float]

_PLACEHOLDER = re.compile(r"\{(question|response)\}")
#: one-token replies whose ids locate the reply inside the prompt (:meth:`JudgeFormat.
#: response_template`)
_PLACEHOLDERS = ("A", "B", "x", "Z", "OK")


def _fill(template: str, question: str, response: str) -> str:
    """``template`` with ``{question}`` and ``{response}`` replaced in one pass."""
    values = {"question": question, "response": response}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def _no_chat_template(tokenizer: Any) -> TLRewardError:
    return TLRewardError(
        f"this tokenizer ({type(tokenizer).__name__}) has no chat template, so a judge's prompt "
        "cannot be built; set tokenizer.chat_template to the judge's instruct template (or "
        "load the instruct model's tokenizer), or pass token ids you built yourself")


@dataclass(frozen=True)
class JudgeFormat:
    """How a judge's prompt is built from a ``(question, response)`` input.

    Attributes:
        template: the user turn; ``{question}`` and ``{response}`` are replaced (in one pass,
            so text inside them is never substituted again).
        system: an optional system message before it.
        answer_prefix: text after the generation prompt (e.g. ``"Verdict:"``), so the last id
            is where the verdict is predicted.
    """

    template: str = VERDICT_TEMPLATE
    system: str | None = None
    answer_prefix: str = ""

    def __post_init__(self) -> None:
        missing = [p for p in ("{question}", "{response}") if p not in self.template]
        if missing:
            raise TLRewardError(
                f"the judge template lacks {' and '.join(missing)}: it must place both the "
                f"question and the response, e.g. {VERDICT_TEMPLATE!r}")

    def prompt_text(self, question: str, response: str) -> str:
        """The user turn the judge reads."""
        return _fill(self.template, question, response)

    def messages(self, user: str) -> list[dict[str, str]]:
        """The judge's conversation: the optional system message, then ``user``."""
        head = [] if self.system is None else [{"role": "system", "content": self.system}]
        return [*head, {"role": "user", "content": user}]

    def encode(self, tokenizer: Any, item: Any, suffix_ids: Sequence[int] = ()) -> EncodedInput:
        """The judge's prompt ids: the chat template with its generation prompt (one BOS), then
        the answer prefix; the last id is the answer position.

        ``item``: ``(question, response)`` (question a string or a conversation) or a
        conversation (its last user turn is the question, its final assistant reply the
        response; earlier turns are not shown to the judge). Token ids and an
        :class:`EncodedInput` are taken as given. ``suffix_ids`` are not used: nothing may
        follow the answer position. ``response_start`` is where the reply's ids begin."""
        if isinstance(item, EncodedInput):
            return item
        kind = input_kind(item)
        if kind == "ids":
            ids = item.tolist() if isinstance(item, torch.Tensor) else item
            return EncodedInput([int(t) for t in ids])
        if kind == "text":
            raise TLRewardError(
                "a judge scores (question, response) pairs or conversations ending in an "
                "assistant reply; for a prompt you built yourself pass its token ids")
        if tokenizer is None:
            raise TLRewardError("a judge's prompts need its tokenizer; load it with tokenizer=")
        if getattr(tokenizer, "chat_template", None) is None:
            raise _no_chat_template(tokenizer)
        question, response = judged_pair(input_messages(item))
        prefix = (tokenizer.encode(self.answer_prefix, add_special_tokens=False)
                  if self.answer_prefix else [])
        ids = [*template_ids(tokenizer, self.messages(self.prompt_text(question, response)),
                             add_generation_prompt=True), *(int(t) for t in prefix)]
        cut = self.template.index("{response}")  # the user turn up to the reply
        before = template_ids(tokenizer, self.messages(_fill(self.template[:cut], question, "")),
                              add_generation_prompt=False)
        start = next((i for i, (a, b) in enumerate(zip(ids, before, strict=False)) if a != b),
                     min(len(ids), len(before)))
        return EncodedInput(ids, start)

    def response_template(self, tokenizer: Any, prompt: Any) -> ResponseTemplate:
        """``prefix + [v] + suffix``: the judge's prompt with a one-token reply ``v`` to
        ``prompt`` (the answer position last), found as the ids that two placeholder replies
        share on either side of one differing id (and a third pair agrees)."""
        conv = prompt_conversation(prompt)
        fulls = [self.encode(tokenizer, (conv, text)).ids for text in _PLACEHOLDERS]
        found = []
        for a, b in itertools.pairwise(fulls):
            n = min(len(a), len(b))
            i = next((k for k in range(n) if a[k] != b[k]), n)
            j = next((k for k in range(n - i) if a[-1 - k] != b[-1 - k]), n - i)
            if len(a) - i - j == 1 and len(b) - i - j == 1:
                found.append((tuple(a[:i]), tuple(a[len(a) - j:])))
        if len(found) < 2 or found[0] != found[1]:
            raise TLRewardError(
                "could not isolate a one-token reply in this judge's prompt (the tokenizer "
                "merges the reply with the text around it); build the sequences yourself and "
                "score them with model.rewards")
        return ResponseTemplate(conv, *found[0])


def judged_pair(messages: Sequence[Mapping[str, str]]) -> tuple[str, str]:
    """``(question, response)`` of a conversation: its last user turn and final assistant
    reply (refused when it ends with a user turn, has none, or the reply is empty)."""
    if not messages or messages[-1]["role"] != "assistant":
        raise TLRewardError("a judge rates a final assistant reply; this conversation ends with "
                            "a user turn: pass (question, response) or add the reply")
    users = [m["content"] for m in messages[:-1] if m["role"] == "user"]
    if not users:
        raise TLRewardError("a judge needs the question: this conversation has no user turn")
    response = messages[-1]["content"]
    if not response.strip():
        raise EmptyResponseError("the response is empty; a judge needs a non-empty reply to rate")
    return users[-1], response


def verdict_token_id(tokenizer: Any, word: str | int, after: str = "") -> int:
    """The one id a judge generates for ``word`` at the answer position (an int is taken as
    the id).

    The rule: the word as the tokenizer writes it right after the prompt's last text
    (``after``, the answer prefix): bare when ``after`` is empty or ends in whitespace (chat
    templates end the generation prompt with a header or a newline, after which a model writes
    ``"Yes"``), with a leading space after other text (``"Verdict:"`` is followed by
    ``" Yes"``). When that form is more than one token the other form is tried; when both
    are, the error names the ids each splits into."""
    if isinstance(word, int) and not isinstance(word, bool):
        return int(word)
    if tokenizer is None:
        raise TLRewardError("finding a verdict's token id needs the judge's tokenizer")
    spaced = bool(after) and not after[-1].isspace()
    forms = [" " + word, word] if spaced else [word, " " + word]
    found = {}
    for form in forms:
        ids = _ids_after(tokenizer, after, form)
        if len(ids) == 1:
            return ids[0]
        found[form] = ids
    shown = "; ".join(f"{f!r} -> {ids} {tokenizer.convert_ids_to_tokens(ids)}"
                      for f, ids in found.items())
    raise TLRewardError(
        f"the verdict {word!r} is not one token of this tokenizer ({shown}); a judge's verdict "
        "is read at one token: pick a word the tokenizer keeps whole, or pass its token id")


def _ids_after(tokenizer: Any, after: str, form: str) -> list[int]:
    """Ids ``form`` adds after the text ``after`` (``form`` alone when the two merge)."""
    base = tokenizer.encode(after, add_special_tokens=False) if after else []
    both = tokenizer.encode(after + form, add_special_tokens=False)
    if both[: len(base)] == base:
        return [int(t) for t in both[len(base):]]
    return [int(t) for t in tokenizer.encode(form, add_special_tokens=False)]


def rating_scale(ratings: Ratings) -> tuple[list[str], list[float]]:
    """``(words, values)`` of ``ratings``: a mapping ``{word: value}``, or words (or ints)
    each worth its number (``"1".."9"``)."""
    if isinstance(ratings, Mapping):
        words, values = [str(k) for k in ratings], [float(v) for v in ratings.values()]
    else:
        words = [str(r) for r in ratings]
        try:
            values = [float(w) for w in words]
        except ValueError as exc:
            raise TLRewardError(
                f"rating words {words} are not numbers: pass ratings={{word: value, ...}}"
            ) from exc
    if len(words) < 2:
        raise TLRewardError("a rating judge needs at least two rating tokens")
    return words, values


def _tokenizer_for(name_or_path: str | None, hf_model: Any, tokenizer: Any,
                   trust_remote_code: bool) -> Any:
    """The judge's tokenizer: given, or loaded from ``name_or_path`` (or the model's path)."""
    if tokenizer is not None:
        return tokenizer
    source = name_or_path or getattr(hf_model, "name_or_path", None)
    if not source:
        raise TLRewardError("a judge needs its tokenizer to find the verdict tokens; pass "
                            "tokenizer=")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise TLRewardError(f"could not load the judge's tokenizer from {source!r} ({exc}); "
                            "pass tokenizer=") from exc


def load_judge(
    cls: Any,
    name_or_path: str | None = None,
    hf_model: Any = None,
    tokenizer: Any = None,
    *,
    template: str | None = None,
    system: str | None = None,
    answer_prefix: str = "",
    verdict: tuple[str | int, str | int] | None = ("Yes", "No"),
    ratings: Ratings | None = None,
    pooling: str | None = "mask",
    **kwargs: Any,
) -> Any:
    """Load a causal LM as a generative judge on the backend ``cls`` (see the module
    docstring); ``kwargs`` go to ``cls.from_pretrained`` (device, dtype, ...).

    Args:
        template: the verdict question (``{question}``, ``{response}``); default
            :data:`VERDICT_TEMPLATE`, or :data:`RATING_TEMPLATE` with ``ratings``.
        system, answer_prefix: see :class:`JudgeFormat`.
        verdict: ``(yes, no)`` words (or token ids): the score is ``logit(yes) - logit(no)``.
        ratings: rating words worth their numbers (``DIGIT_RATINGS``) or ``{word: value}``:
            the reward is the expected rating (HookedRewardModel only); replaces ``verdict``.
        pooling: ``"mask"``: the answer position is the last real token, whatever its id.
    """
    for key in ("lm_head_rows", "head_weights", "step_tag"):
        if kwargs.get(key) is not None:
            raise TLRewardError(f"{key}= is set by the judge loader; drop it")
    if ratings is not None and verdict not in (None, ("Yes", "No")):
        raise TLRewardError("pass verdict= or ratings=, not both")
    if ratings is None and verdict is None:
        raise TLRewardError("a judge needs verdict=(yes, no) or ratings=")
    # the bridge (starts_at_layer False: HF's forward runs whole) keeps HF's LM head as is
    if ratings is not None and not getattr(cls, "starts_at_layer", True):
        raise TLRewardError(
            f"{cls.__name__} reads a judge's yes/no verdict only: a rating judge's expected "
            "rating is a nonlinear head, loaded on HookedRewardModel.from_judge(..., ratings=)")
    from tl_reward.model.loading import BUILTIN_MODELS

    if hf_model is None and name_or_path in BUILTIN_MODELS:  # offline (the SmolLM2 judge)
        hf_model, builtin_tokenizer = BUILTIN_MODELS[name_or_path](kwargs.get("dtype"))
        tokenizer = tokenizer or builtin_tokenizer
    tokenizer = _tokenizer_for(name_or_path, hf_model, tokenizer,
                               bool(kwargs.get("trust_remote_code", False)))
    if getattr(tokenizer, "chat_template", None) is None:
        raise _no_chat_template(tokenizer)
    if ratings is None:
        assert verdict is not None
        fmt = JudgeFormat(template or VERDICT_TEMPLATE, system, answer_prefix)
        yes, no = (verdict_token_id(tokenizer, w, answer_prefix) for w in verdict)
        if yes == no:
            raise TLRewardError(f"the verdicts {verdict} are the same token {yes}")
        model = cls.from_pretrained(name_or_path, hf_model, tokenizer, pooling=pooling,
                                    lm_head_rows=[no, yes], head_weights=[-1.0, 1.0],
                                    objective_names=list(VERDICT_OBJECTIVES), **kwargs)
        model.input_format = fmt
        return model
    words, values = rating_scale(ratings)
    text = template or RATING_TEMPLATE.replace("{lowest}", words[0]).replace(
        "{highest}", words[-1])
    fmt = JudgeFormat(text, system, answer_prefix)
    ids = [verdict_token_id(tokenizer, w, answer_prefix) for w in words]
    if len(set(ids)) != len(ids):
        raise TLRewardError(f"the rating words {words} share token ids {ids}")
    model = cls.from_pretrained(name_or_path, hf_model, tokenizer, pooling=pooling,
                                lm_head_rows=ids, **kwargs)
    use_rating_head(model, values, words)
    model.input_format = fmt
    return model


def use_rating_head(model: Any, values: Sequence[float], words: Sequence[str] = ()) -> None:
    """Replace a HookedRewardModel's head (the rating tokens' LM-head rows as ``W_U``, gain
    folded) by the :class:`~tl_reward.model.rating_head.RatingHead` over them; ``W_U`` becomes
    a NaN ``[d_model, 1]`` column, as for an MLP head, and ``d_vocab_out`` 1."""
    from tl_reward.model.rating_head import RatingHead

    w_u, b_u = model.W_U.detach(), model.b_U.detach()
    rows = torch.nn.Linear(w_u.shape[0], w_u.shape[1], device=w_u.device, dtype=w_u.dtype)
    with torch.no_grad():
        rows.weight.copy_(w_u.T)
        rows.bias.copy_(b_u)
    model.reward_head = RatingHead(rows, values, words).to(w_u.device)
    nan = torch.full((w_u.shape[0], 1), float("nan"), device=w_u.device, dtype=w_u.dtype)
    grad = model.unembed.W_U.requires_grad
    model.unembed.W_U = torch.nn.Parameter(nan, requires_grad=grad)
    model.unembed.b_U = torch.nn.Parameter(nan[0].clone(), requires_grad=grad)
    model.cfg.d_vocab_out = 1
