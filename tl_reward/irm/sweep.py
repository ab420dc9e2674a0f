"""The implicit reward of every single-token response: an IRM vocabulary sweep.

For a prompt with response template ``prefix + [v] + suffix``, the implicit reward of ``v`` is
``beta * ([log pi(v | prefix) - log pi_ref(v | prefix)]
+ sum_k [log pi(s_k | prefix, v, s_<k) - log pi_ref(s_k | prefix, v, s_<k)])``.
The first term is one forward pass of each model over the prefix for the whole vocabulary (the
next-token distribution at the response start). The suffix terms (the template's closing tokens)
run per candidate, in batches, against the prefix's key/value cache.

The result converts to a :class:`~tl_reward.sweep.vocab_sweep.VocabSweep`, so
``model_agreement`` compares it with an explicit reward model's sweep (Kendall, RBO).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from tl_reward import tl_backend
from tl_reward.errors import TLRewardError
from tl_reward.irm.models import hooked_logits, is_hooked, model_device, vocab_size
from tl_reward.model.response_template import Prompt, ResponseTemplate, response_template
from tl_reward.results import ShortRepr
from tl_reward.sweep.vocab_sweep import VocabSweep, vocabulary_ids


@dataclass(repr=False)
class IrmVocabSweep(ShortRepr):
    """Implicit rewards of N single-token responses for P prompts.

    Attributes:
        token_ids, tokens: ``[N]`` candidate ids, ascending, and their decoded strings.
        first: ``[N, P]`` float32 ``log pi(v | prefix) - log pi_ref(v | prefix)``.
        suffix: ``[N, P]`` float32 log-ratio summed over the template's closing tokens.
        beta: the DPO temperature; ``model_name``: a name for the policy/reference pair.
        labels / prompts: one label and one conversation per prompt.
    """

    token_ids: Int[torch.Tensor, " n"]
    tokens: list[str]
    first: Float[torch.Tensor, "n prompt"]
    suffix: Float[torch.Tensor, "n prompt"]
    beta: float
    labels: list[str]
    prompts: list[Any]
    model_name: str

    @property
    def rewards(self) -> Float[torch.Tensor, "n prompt"]:
        """``beta * (first + suffix)``: each candidate's implicit reward."""
        return self.beta * (self.first + self.suffix)

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    def to_vocab_sweep(self) -> VocabSweep:
        """The implicit rewards as a ``VocabSweep`` (objective ``"implicit"``)."""
        r = self.rewards
        return VocabSweep(self.token_ids, list(self.tokens), r.clone(), r[:, :, None].clone(),
                          list(self.labels), list(self.prompts), ["implicit"], self.model_name)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per (token, prompt): the two log-ratio terms and the reward."""
        r = self.rewards
        return pd.concat([pd.DataFrame({
            "token_id": self.token_ids.numpy(), "token": self.tokens, "prompt": lab,
            "first_logratio": self.first[:, p].numpy(),
            "suffix_logratio": self.suffix[:, p].numpy(), "reward": r[:, p].numpy()})
            for p, lab in enumerate(self.labels)], ignore_index=True)

    def plot(self, k: int = 15) -> Any:
        """Top and bottom ``k`` tokens of every prompt by implicit reward (plotly)."""
        return self.to_vocab_sweep().plot(k)


class _PrefixRunner:
    """One model's prefix, run once; continuations of it scored by next-token logits."""

    def __init__(self, model: Any, prefix: list[int]) -> None:
        self.model = model
        self.device = model_device(model)
        ids = torch.tensor(prefix, device=self.device)
        with torch.no_grad():
            if is_hooked(model):
                self.cache = tl_backend.build_prefix_cache(model, ids)
                self.last_logits = hooked_logits(model, self.cache.resid[-1:])[0]
            else:
                out = model(input_ids=ids[None], use_cache=True)
                self.cache = out.past_key_values
                self.last_logits = out.logits[0, -1]
        self.length = len(prefix)

    @torch.no_grad()
    def continuation_logits(self, tokens: Int[torch.Tensor, "b s"]) -> torch.Tensor:
        """``[b, s, vocab]`` logits at the continuation positions ``prefix + tokens[i]``."""
        tokens = tokens.to(self.device)
        if is_hooked(self.model):
            resid = tl_backend.run_after_prefix(self.model, self.cache, tokens)
            return hooked_logits(self.model, resid)
        cache = copy.deepcopy(self.cache)
        cache.batch_repeat_interleave(tokens.shape[0])
        pos = torch.arange(self.length, self.length + tokens.shape[1], device=self.device)
        mask = torch.ones(tokens.shape[0], self.length + tokens.shape[1], dtype=torch.long,
                          device=self.device)
        return self.model(input_ids=tokens, past_key_values=cache, attention_mask=mask,
                          position_ids=pos.expand(tokens.shape[0], -1), use_cache=True).logits


def _suffix_logprobs(runner: _PrefixRunner, cand: torch.Tensor, suffix: list[int]
                     ) -> torch.Tensor:
    """``[b]`` float32 sum over the suffix of ``log p(s_k | prefix, v, s_<k)``."""
    if not suffix:
        return torch.zeros(cand.shape[0], device=runner.device)
    suf = torch.tensor(suffix, device=runner.device)
    inp = torch.cat([cand[:, None].to(runner.device), suf[:-1].expand(cand.shape[0], -1)], 1)
    lp = runner.continuation_logits(inp).float().log_softmax(-1)
    return lp.gather(-1, suf.expand(cand.shape[0], -1)[..., None])[..., 0].sum(-1)


def irm_vocab_sweep(
    policy: Any, reference: Any, prompts: Prompt | Sequence[Prompt] | Mapping[str, Prompt],
    beta: float, tokenizer: Any = None, ids: Sequence[int] | None = None,
    include_special: bool = False, batch_size: int = 128, model_name: str = "irm",
    progress: bool = True,
) -> IrmVocabSweep:
    """Implicit rewards of every candidate token as the whole response to each prompt.

    Args:
        policy, reference: causal LMs (``HookedTransformer`` or HF) sharing a tokenizer.
        prompts: a prompt, a list, or ``{label: prompt}``.
        beta: the DPO temperature.
        tokenizer: the shared tokenizer (default: ``policy.tokenizer``).
        ids: candidate ids (default: the tokenizer's vocabulary without special tokens).
        batch_size: candidates per suffix batch.
    """
    tok = tokenizer if tokenizer is not None else getattr(policy, "tokenizer", None)
    if tok is None:
        raise TLRewardError("irm_vocab_sweep needs the tokenizer; pass tokenizer=")
    if beta <= 0:
        raise TLRewardError(f"beta must be positive, got {beta}")
    if isinstance(prompts, Mapping):
        labels, plist = list(prompts), list(prompts.values())
    elif isinstance(prompts, str) or (prompts and isinstance(prompts[0], Mapping)):
        labels, plist = ["prompt"], [prompts]
    else:
        plist = list(prompts)  # type: ignore[arg-type]
        labels = [f"prompt{i}" for i in range(len(plist))]
    vocab = vocab_size(policy)
    cand = sorted({int(i) for i in ids}) if ids is not None else vocabulary_ids(
        tok, vocab, include_special)
    if not cand or cand[0] < 0 or cand[-1] >= vocab:
        raise TLRewardError(f"candidate ids must be a non-empty subset of [0, {vocab})")
    cand_t = torch.tensor(cand)
    first, suffix = torch.zeros(len(cand), len(plist)), torch.zeros(len(cand), len(plist))
    templates: list[ResponseTemplate] = [response_template(tok, p) for p in plist]
    for p, tpl in enumerate(templates):
        for sign, model in ((1.0, policy), (-1.0, reference)):
            run = _PrefixRunner(model, list(tpl.prefix))
            lp = run.last_logits.float().log_softmax(-1)
            first[:, p] += sign * lp[cand_t.to(lp.device)].cpu()
            for b in tqdm(range(0, len(cand), batch_size), desc=f"IRM sweep {labels[p]}",
                          disable=not progress, leave=False):
                chunk = cand_t[b:b + batch_size]
                suffix[b:b + len(chunk), p] += sign * _suffix_logprobs(
                    run, chunk, list(tpl.suffix)).cpu()
    return IrmVocabSweep(cand_t, [tok.decode([i]) for i in cand], first, suffix, float(beta),
                         labels, [list(t.conversation) for t in templates], model_name)
