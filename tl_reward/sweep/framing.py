"""Framing: does the same model rank tokens alike under differently worded prompts?

The paper's prompts ask for the "greatest", "best" and "worst" thing: a reward model that read
the prompt should agree on the first two and reverse on the third. For every pair of prompts:
Kendall's tau-b, Spearman's rho, rank-biased overlap of the tops and of the bottoms, and the
tokens whose percentile moves most between them.

Example:
    >>> framing = prompt_framing(sweep)
    >>> framing.to_dataframe(); framing.shifts("best", "worst")
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.errors import TLRewardError
from tl_reward.results import ShortRepr
from tl_reward.sweep.agreement import METRICS, rank_metrics
from tl_reward.sweep.extremes import percentiles
from tl_reward.sweep.vocab_sweep import VocabSweep


@dataclass(repr=False)
class PromptFraming(ShortRepr):
    """Agreement of one model's rankings across prompts.

    Attributes:
        labels: prompt labels; ``kendall_tau_b``, ``spearman_rho``, ``rbo_top``,
            ``rbo_bottom``: ``[P, P]`` matrices (diagonal 1); ``p``: the RBO persistence.
        percentiles: ``[N, P]`` percentile of every token under each prompt (the swept
            ``token_ids``, ``tokens``).
    """

    labels: list[str]
    kendall_tau_b: Float[torch.Tensor, "prompt prompt"]
    spearman_rho: Float[torch.Tensor, "prompt prompt"]
    rbo_top: Float[torch.Tensor, "prompt prompt"]
    rbo_bottom: Float[torch.Tensor, "prompt prompt"]
    percentiles: Float[torch.Tensor, "n prompt"]
    token_ids: torch.Tensor
    tokens: list[str]
    p: float

    def to_dataframe(self) -> pd.DataFrame:
        """One row per prompt pair with the four agreement measures."""
        return pd.DataFrame([{"prompt_a": self.labels[i], "prompt_b": self.labels[j],
                              **{m: float(getattr(self, m)[i, j]) for m in METRICS}}
                             for i, j in combinations(range(len(self.labels)), 2)])

    def shifts(self, a: int | str, b: int | str, k: int = 10) -> pd.DataFrame:
        """The ``k`` tokens that rise most and the ``k`` that fall most from prompt ``a`` to
        ``b`` (percentile points)."""
        i, j = (self.labels.index(x) if isinstance(x, str) else x for x in (a, b))
        delta = (self.percentiles[:, j] - self.percentiles[:, i]).numpy()
        order = np.argsort(delta, kind="mergesort")
        pick = np.r_[order[::-1][:k], order[:k]]
        return pd.DataFrame({
            "direction": ["rises"] * min(k, len(order)) + ["falls"] * min(k, len(order)),
            "token_id": self.token_ids.numpy()[pick],
            "token": [self.tokens[x] for x in pick],
            f"percentile:{self.labels[i]}": self.percentiles[pick, i].numpy(),
            f"percentile:{self.labels[j]}": self.percentiles[pick, j].numpy(),
            "change": delta[pick]})

    def plot(self, a: int | str = 0, b: int | str = -1) -> Any:
        """Heatmap of Kendall's tau-b and a percentile scatter of prompts ``a`` and ``b``."""
        from tl_reward.viz.vocab import plot_framing

        return plot_framing(self, a, b)


def prompt_framing(sweep: VocabSweep, objective: int | str = "score", p: float = 0.9
                   ) -> PromptFraming:
    """Pairwise agreement of a sweep's prompts (needs at least two)."""
    n_p = len(sweep.labels)
    if n_p < 2:
        raise TLRewardError("framing compares prompts; sweep at least two")
    vals = [sweep.values(i, objective).double().numpy() for i in range(n_p)]
    ids = sweep.token_ids.tolist()
    mats = {k: torch.eye(n_p, dtype=torch.float64) for k in METRICS}
    for i, j in combinations(range(n_p), 2):
        res = rank_metrics(ids, vals[i], vals[j], p)
        for k in METRICS:
            mats[k][i, j] = mats[k][j, i] = res[k]
    pct = torch.stack([percentiles(sweep, i, objective) for i in range(n_p)], 1)
    return PromptFraming(list(sweep.labels), *(mats[k] for k in METRICS), pct, sweep.token_ids,
                         list(sweep.tokens), p)
