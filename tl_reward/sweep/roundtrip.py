"""Round-trip diagnostic: does a token survive decode -> chat template -> re-tokenise?

The published optimal/pessimal-token code decoded each token id to a string, put it in the
chat template *as a string* and tokenised the result with special tokens added. That path can
change what the model is shown: a tokenizer that adds BOS duplicates the template's BOS, and a
decoded string can tokenise differently in context (merged with its neighbours, stripped by
the template, or not valid UTF-8 on its own). Our sweep scores the id path
``prefix + [v] + suffix`` instead; this module measures how often the text path differs and
scores the text path for comparison.

Paths (``path=``):

* ``"paper"``: ``tokenizer(apply_chat_template(conv, tokenize=False))``, as published.
* ``"template"``: ``apply_chat_template(conv, tokenize=True)``: the decoded string re-tokenised
  inside the template (no BOS duplication; what ``model.encode((prompt, text))`` does).

Example:
    >>> report = roundtrip_report(model, "What, in one word, is the best thing ever?")
    >>> report.summary()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from tqdm.auto import tqdm

from tl_reward.model.response_template import Prompt, ResponseTemplate, response_template
from tl_reward.results import ShortRepr
from tl_reward.stats.ranks import kendall_tau_b, spearman_rho
from tl_reward.sweep.vocab_sweep import (
    candidate_ids,
    score_text_path,
    score_vocabulary,
    text_path_ids,
)

if TYPE_CHECKING:
    from tl_reward.model.hooked_reward_model import HookedRewardModel

@dataclass(repr=False)
class RoundTripReport(ShortRepr):
    """Per token: does the text path give the same ids as the id path?

    Attributes:
        token_ids, tokens: ``[N]`` ids checked and their decoded strings.
        identical: ``[N]`` the text path equals ``prefix + [v] + suffix``.
        bos_duplicated: ``[N]`` the text path starts with a second BOS.
        survives: ``[N]`` the sequences agree once a duplicated BOS is removed (the response
            token came back unchanged).
        text_ids: the text path's ids per token; ``path``: which text path.
        id_scores, text_scores: ``[N]`` scores of both paths, when computed.
    """

    token_ids: Int[torch.Tensor, " n"]
    tokens: list[str]
    identical: Bool[torch.Tensor, " n"]
    bos_duplicated: Bool[torch.Tensor, " n"]
    survives: Bool[torch.Tensor, " n"]
    text_ids: list[list[int]]
    template: ResponseTemplate
    path: str
    id_scores: Float[torch.Tensor, " n"] | None = None
    text_scores: Float[torch.Tensor, " n"] | None = None

    @property
    def failure_rate(self) -> float:
        """Share of tokens whose text path differs from the id path in any way."""
        return float((~self.identical).float().mean())

    @property
    def token_failure_rate(self) -> float:
        """Share of tokens that do not survive the round trip (BOS duplication aside)."""
        return float((~self.survives).float().mean())

    def summary(self) -> pd.DataFrame:
        """Counts and shares: identical, BOS duplicated, token changed; rank agreement of the
        two paths' scores when they were computed."""
        n = len(self.tokens)
        rows = {"tokens checked": n,
                "text path identical to id path": int(self.identical.sum()),
                "BOS duplicated": int(self.bos_duplicated.sum()),
                "token did not survive": int((~self.survives).sum())}
        df = pd.DataFrame({"count": rows}).assign(share=lambda d: d["count"] / max(n, 1))
        if self.id_scores is not None and self.text_scores is not None:
            a, b = self.id_scores.numpy(), self.text_scores.numpy()
            df.loc["Kendall tau-b (id vs text scores)"] = [n, kendall_tau_b(a, b).statistic]
            df.loc["Spearman rho (id vs text scores)"] = [n, spearman_rho(a, b).statistic]
            df.loc["max |score difference|"] = [n, float(np.abs(a - b).max())]
        return df

    def to_dataframe(self) -> pd.DataFrame:
        """One row per token: id, string, flags, the text path's response ids."""
        p, s = len(self.template.prefix), len(self.template.suffix)
        resp = []
        for ids, dup in zip(self.text_ids, self.bos_duplicated.tolist(), strict=True):
            core = ids[1:] if dup else ids
            resp.append(core[p: len(core) - s] if len(core) >= p + s else core)
        df = pd.DataFrame({"token_id": self.token_ids.numpy(), "token": self.tokens,
                           "identical": self.identical.numpy(),
                           "bos_duplicated": self.bos_duplicated.numpy(),
                           "survives": self.survives.numpy(), "text_response_ids": resp})
        if self.id_scores is not None and self.text_scores is not None:
            df["id_score"] = self.id_scores.numpy()
            df["text_score"] = self.text_scores.numpy()
        return df

    def plot(self) -> Any:
        """Bar chart of the round-trip outcomes (plotly)."""
        from tl_reward.viz.vocab import plot_roundtrip

        return plot_roundtrip(self)


def roundtrip_check(
    tokenizer: Any,
    prompt: Prompt,
    ids: Sequence[int],
    path: str = "paper",
    progress: bool | None = None,
) -> RoundTripReport:
    """Compare the text path with the id path for each token id (no model needed)."""
    template = response_template(tokenizer, prompt)
    bos = getattr(tokenizer, "bos_token_id", None)
    cands = [int(v) for v in ids]
    show = progress if progress is not None else len(cands) > 2000
    texts = [text_path_ids(tokenizer, template.conversation, v, path)
             for v in tqdm(cands, disable=not show, desc="round trip", unit="id")]
    refs = [template.ids(v) for v in cands]
    identical = [got == ref for got, ref in zip(texts, refs, strict=True)]
    dup = [bos is not None and len(got) > 1 and got[0] == got[1] == bos for got in texts]
    survives = [(g[1:] if d else g) == r for g, d, r in zip(texts, dup, refs, strict=True)]
    return RoundTripReport(
        torch.tensor(cands, dtype=torch.long), tokenizer.batch_decode([[v] for v in cands]),
        torch.tensor(identical, dtype=torch.bool), torch.tensor(dup, dtype=torch.bool),
        torch.tensor(survives, dtype=torch.bool), texts, template, path)


def roundtrip_report(
    model: HookedRewardModel,
    prompt: Prompt,
    ids: Sequence[int] | torch.Tensor | None = None,
    path: str = "paper",
    score: bool = False,
    batch_size: int = 64,
    progress: bool | None = None,
) -> RoundTripReport:
    """:func:`roundtrip_check` over ``ids`` (default: the vocabulary minus special tokens).

    With ``score=True`` both paths are also scored (the text path with full forwards, as
    published), so the report shows how the round trip changes scores and rankings.
    """
    cands = candidate_ids(model, ids)
    report = roundtrip_check(model.tokenizer, prompt, cands, path, progress)
    if score:
        by_id = score_vocabulary(model, [report.template.conversation], cands,
                                 batch_size=batch_size, progress=progress)
        report.id_scores = by_id.values(0)
        report.text_scores = score_text_path(model, report.template, torch.tensor(cands), path,
                                             batch_size)[1]
    return report
