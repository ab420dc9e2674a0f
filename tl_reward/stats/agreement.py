"""Rank agreement of two rewards on the same items: the one :class:`RankAgreement`.

Used by the behavioural comparison of reward models and by the implicit-reward pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tl_reward.errors import TLRewardError
from tl_reward.results import ShortRepr
from tl_reward.stats.estimate import Estimate
from tl_reward.stats.ranks import (
    average_ranks,
    kendall_interval,
    kendall_tau_b,
    rank_biased_overlap,
    spearman_rho,
    top_ranking,
)
from tl_reward.stats.resampling import fisher_interval, pearson_rows

RANK_STATS: dict[str, Callable[[np.ndarray, np.ndarray, float], float]] = {
    "kendall_tau_b": lambda a, b, p: kendall_tau_b(a, b).statistic,
    "spearman_rho": lambda a, b, p: spearman_rho(a, b).statistic,
    "rbo_top": lambda a, b, p: rank_biased_overlap(top_ranking(range(len(a)), a),
                                                   top_ranking(range(len(b)), b), p),
}
#: Why RBO carries no interval (docs/statistics.md, "One interval rule").
NO_RANK_INTERVAL = ("no interval: rank-biased overlap has no sampling theory (tau-b and rho "
                    "carry the intervals)")


@dataclass(repr=False)
class RankAgreement(ShortRepr):
    """Kendall tau-b, Spearman rho and rank-biased overlap (top-weighted, ``p``) of two rewards
    on the same items, each an :class:`Estimate`; tau-b and rho have intervals
    (:func:`rank_agreement`) and carry their test's p-value (exact for small untied samples).

    Attributes:
        x, y: the two rewards (NaN items dropped); model_a, model_b: their labels.
    """

    kendall_tau_b: Estimate
    spearman_rho: Estimate
    rbo_top: Estimate
    x: np.ndarray = field(repr=False)
    y: np.ndarray = field(repr=False)
    model_a: str = "a"
    model_b: str = "b"

    def __str__(self) -> str:
        return f"tau_b {self.kendall_tau_b}, rho {self.spearman_rho.value:+.3f}"

    def to_dataframe(self) -> pd.DataFrame:
        """One row per measure: value, CI, p-value, n, method."""
        return pd.DataFrame([{"model_a": self.model_a, "model_b": self.model_b,
                              "measure": m, **getattr(self, m).to_dict()} for m in RANK_STATS])

    def plot(self) -> Any:
        """Scatter of the two rewards (plotly)."""
        from tl_reward.viz.irm import plot_reward_scatter

        return plot_reward_scatter(self.x, self.y, self.model_a, self.model_b,
                                   f"Kendall tau-b {self.kendall_tau_b.value:.3f}")


def rank_agreement(a: Any, b: Any, names: tuple[str, str] = ("a", "b"),
                   confidence: float = 0.95, rbo_p: float = 0.9, units: Any = None,
                   unit: str = "unit") -> RankAgreement:
    """:class:`RankAgreement` of rewards ``a`` and ``b`` on the same items (NaN items dropped;
    at least 4 left).

    Tau-b's interval is :func:`~tl_reward.stats.ranks.kendall_interval` (at least 8 units),
    rho's the jackknife Fisher-z interval over units of the cascade's correlations
    (:func:`~tl_reward.stats.resampling.fisher_interval`: at least 10 units, floor se
    ``sqrt((1 + rho^2 / 2) / (n - 3))``; the jackknife costs O(units x items)); RBO has none.
    ``units``: one label per item when items are not independent (e.g. the tokens of one
    word): tau-b's variance then sums each unit's items (cluster-robust), rho's jackknife leaves
    out one unit at a time, and ``n`` counts units. Near-duplicates counted one by one give
    intervals too narrow by about the square root of the items per unit."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise TLRewardError(f"need two reward vectors of the same length, got {x.shape} and "
                            f"{y.shape}")
    if units is not None and len(units) != x.size:
        raise TLRewardError(f"{len(units)} unit labels for {x.size} items")
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    labels = None if units is None else np.asarray(units, dtype=object)[keep].astype(str)
    if x.size < 4:
        raise TLRewardError(f"rank agreement needs at least 4 items without NaN, got {x.size}")
    n = int(x.size) if labels is None else len(set(labels))
    over = "items" if units is None else f"{unit}s"
    tau = kendall_tau_b(x, y)
    lo, hi, why = kendall_interval(x, y, tau.statistic, confidence, labels)
    tau_how = f"U-statistic variance over {over}, Fisher z; rank test"
    rho = spearman_rho(x, y)
    groups = np.unique(labels if labels is not None else np.arange(x.size),
                       return_inverse=True)[1]
    r_lo, r_hi, r_why = fisher_interval(rho.statistic, _rho_jackknife(x, y, groups),
                                        ((1 + rho.statistic**2 / 2) / max(n - 3, 1))**.5,
                                        confidence)
    rho_how = f"jackknife Fisher-z interval over {over}" + (f" ({r_why})" if r_why else "")
    out = {"kendall_tau_b": Estimate(tau.statistic, lo, hi, tau.p_value, n,
                                     f"{tau_how} ({why})" if why else tau_how, confidence),
           "spearman_rho": Estimate(rho.statistic, r_lo, r_hi, rho.p_value, n,
                                    f"{rho_how}; rank test", confidence),
           "rbo_top": Estimate(RANK_STATS["rbo_top"](x, y, rbo_p), n=n, method=NO_RANK_INTERVAL)}
    return RankAgreement(**out, x=x, y=y, model_a=names[0], model_b=names[1])


def _rho_jackknife(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Spearman's rho with each group's items left out in turn (``groups``: labels 0..G-1 per
    item). The others' average ranks are their full ranks less, per item, the left-out items
    below it and half those tied with it, so nothing is ranked again (O(groups x items))."""
    full = [average_ranks(x), average_ranks(y)]
    out = np.empty(int(groups.max()) + 1)
    for g in range(out.size):
        gone = groups == g
        ranks = [r[~gone] - (np.searchsorted(np.sort(v[gone]), v[~gone])
                             + np.searchsorted(np.sort(v[gone]), v[~gone], "right")) / 2
                 for r, v in zip(full, (x, y), strict=True)]
        out[g] = pearson_rows(*ranks)
    return out
