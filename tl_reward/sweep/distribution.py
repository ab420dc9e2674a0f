"""Distribution of a vocabulary sweep's scores per prompt: mean, variance, skew, quantiles.

The paper reports that reward models spread their scores unevenly: the tails are not
symmetric (skew) and the extremes sit far from the bulk. ``score_distribution`` gives the
moments (scipy's definitions: population variance ``ddof=0`` is ``var``, sample ``ddof=1`` is
``var_sample``; skew and excess kurtosis biased, as ``scipy.stats.skew`` / ``kurtosis``).

Example:
    >>> score_distribution(sweep).to_dataframe()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from scipy.stats import kurtosis, skew

from tl_reward.results import ShortRepr
from tl_reward.sweep.vocab_sweep import VocabSweep

QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


@dataclass(repr=False)
class ScoreDistribution(ShortRepr):
    """Summary statistics of each prompt's scores over the swept tokens.

    Attributes:
        labels: prompt labels.
        values: ``[N, P]`` the values summarised.
        stats: one row per prompt: n, mean, var, var_sample, std, skew, kurtosis (excess),
            min, quantiles, max, and the high/low tail gap ``(max - median) - (median - min)``.
    """

    labels: list[str]
    values: Float[torch.Tensor, "n prompt"]
    stats: pd.DataFrame
    objective: str

    def to_dataframe(self) -> pd.DataFrame:
        return self.stats

    def plot(self, bins: int = 80) -> Any:
        """Overlaid histograms of each prompt's scores (plotly)."""
        from tl_reward.viz.vocab import plot_distribution

        return plot_distribution(self, bins=bins)


def _moments(v: np.ndarray) -> dict[str, float]:
    flat = v.var() == 0  # skew and kurtosis undefined
    out = {"n": len(v), "mean": v.mean(), "var": v.var(),
           "var_sample": v.var(ddof=1) if len(v) > 1 else np.nan, "std": v.std(),
           "skew": np.nan if flat else skew(v), "kurtosis": np.nan if flat else kurtosis(v),
           "min": v.min(), **{f"q{round(q * 100):02d}": np.quantile(v, q) for q in QUANTILES},
           "max": v.max()}
    out["tail_gap"] = (out["max"] - out["q50"]) - (out["q50"] - out["min"])
    return {k: float(x) for k, x in out.items()}


def score_distribution(sweep: VocabSweep, objective: int | str = "score") -> ScoreDistribution:
    """Moments and quantiles of every prompt's values over the swept tokens."""
    cols = [sweep.values(p, objective).double() for p in range(len(sweep.labels))]
    stats = pd.DataFrame([_moments(c.numpy()) for c in cols],
                         index=pd.Index(sweep.labels, name="prompt"))
    stats["n"] = stats["n"].astype(int)
    return ScoreDistribution(list(sweep.labels), torch.stack(cols, 1), stats, str(objective))
