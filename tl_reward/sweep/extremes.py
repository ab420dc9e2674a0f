"""Optimal and pessimal tokens: the top and bottom ``k`` of a vocabulary sweep per prompt.

Example:
    >>> extremes = top_bottom_tokens(sweep, k=10)
    >>> extremes.to_dataframe()          # prompt, side, rank, token, value, percentile
    >>> extremes.plot()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int

from tl_reward.results import ShortRepr
from tl_reward.sweep.lexicon import percentile_of

if TYPE_CHECKING:
    from tl_reward.sweep.vocab_sweep import VocabSweep


@dataclass(repr=False)
class TokenExtremes(ShortRepr):
    """The ``k`` highest and lowest tokens of each prompt.

    Attributes:
        labels: prompt labels; ``tokens``: id -> decoded string for every listed id.
        top_ids, bottom_ids: ``[P, k]`` token ids, best first / worst first, and
            ``top_values``, ``bottom_values`` their values.
        objective: what was ranked (``"score"`` or an objective name); ``n``: tokens ranked
            per prompt.
    """

    labels: list[str]
    top_ids: Int[torch.Tensor, "prompt k"]
    top_values: Float[torch.Tensor, "prompt k"]
    bottom_ids: Int[torch.Tensor, "prompt k"]
    bottom_values: Float[torch.Tensor, "prompt k"]
    tokens: dict[int, str]
    objective: str
    n: int

    def to_dataframe(self) -> pd.DataFrame:
        """One row per (prompt, side, rank) with token id, string and value."""
        return pd.DataFrame([
            {"prompt": lab, "side": side, "rank": r + 1, "token_id": i, "token": self.tokens[i],
             "value": v} for p, lab in enumerate(self.labels)
            for side, ids, vals in (("top", self.top_ids, self.top_values),
                                    ("bottom", self.bottom_ids, self.bottom_values))
            for r, (i, v) in enumerate(zip(ids[p].tolist(), vals[p].tolist(), strict=True))])

    def side_by_side(self, side: str = "top") -> pd.DataFrame:
        """Rank x prompt table of the decoded tokens (as the paper prints them)."""
        ids = self.top_ids if side == "top" else self.bottom_ids
        return pd.DataFrame({lab: [self.tokens[i] for i in ids[p].tolist()]
                             for p, lab in enumerate(self.labels)},
                            index=pd.RangeIndex(1, ids.shape[1] + 1, name="rank"))

    def plot(self) -> Any:
        """Horizontal bars of the top and bottom tokens per prompt (plotly)."""
        from tl_reward.viz.vocab import plot_extremes

        return plot_extremes(self)


def top_bottom_tokens(sweep: VocabSweep, k: int = 10, objective: int | str = "score",
                      prompts: list[int | str] | None = None) -> TokenExtremes:
    """The ``k`` best and worst tokens of each prompt (ties broken by lower token id)."""
    idx = [sweep.prompt_index(p) for p in (prompts or range(len(sweep.labels)))]
    k, labels = min(k, len(sweep)), [sweep.labels[p] for p in idx]
    ids = sweep.token_ids.numpy()
    vals = [sweep.values(p, objective).double().numpy() for p in idx]
    best = [np.lexsort((ids, -v))[:k] for v in vals]  # value descending, then id ascending
    worst = [np.lexsort((ids, v))[:k] for v in vals]
    top_ids, bottom_ids = [ids[o] for o in best], [ids[o] for o in worst]
    listed = {int(t) for x in top_ids + bottom_ids for t in x}
    pos = {int(t): i for i, t in enumerate(ids.tolist()) if int(t) in listed}
    sides = (top_ids, [v[o] for v, o in zip(vals, best, strict=True)],
             bottom_ids, [v[o] for v, o in zip(vals, worst, strict=True)])
    return TokenExtremes(labels, *(torch.tensor(np.stack(x)) for x in sides),
                         {t: sweep.tokens[i] for t, i in pos.items()}, str(objective), len(sweep))


def percentiles(sweep: VocabSweep, prompt: int | str = 0, objective: int | str = "score"
                ) -> Float[torch.Tensor, " n"]:
    """Percentile rank (0-100) of every token within its prompt's distribution."""
    v = sweep.values(prompt, objective).double().numpy()
    return torch.from_numpy(percentile_of(v, v))
