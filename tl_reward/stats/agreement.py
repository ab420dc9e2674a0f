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
from tl_reward.stats.ranks import kendall_tau_b, rank_biased_overlap, spearman_rho, top_ranking
from tl_reward.stats.resampling import bootstrap_indices, percentile_ci

RANK_STATS: dict[str, Callable[[np.ndarray, np.ndarray, float], float]] = {
    "kendall_tau_b": lambda a, b, p: kendall_tau_b(a, b).statistic,
    "spearman_rho": lambda a, b, p: spearman_rho(a, b).statistic,
    "rbo_top": lambda a, b, p: rank_biased_overlap(top_ranking(range(len(a)), a),
                                                   top_ranking(range(len(b)), b), p),
}


@dataclass(repr=False)
class RankAgreement(ShortRepr):
    """Kendall tau-b, Spearman rho and rank-biased overlap (top-weighted, ``p``) of two rewards
    on the same items, each an :class:`Estimate` with a percentile bootstrap CI over items;
    tau-b and rho carry their test's p-value (exact for small untied samples).

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
                   n_bootstrap: int = 2000, confidence: float = 0.95, seed: int = 0,
                   rbo_p: float = 0.9, units: Any = None, unit: str = "unit") -> RankAgreement:
    """:class:`RankAgreement` of rewards ``a`` and ``b`` on the same items (NaN items dropped;
    at least 4 left).

    ``units``: one label per item when items are not independent (e.g. the tokens of one
    word): the CIs then resample whole units (a cluster bootstrap), named ``unit`` in each
    estimate's method. Near-duplicate items resampled one by one give CIs too narrow by about
    the square root of the items per unit."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise TLRewardError(f"need two reward vectors of the same length, got {x.shape} and "
                            f"{y.shape}")
    if units is not None and len(units) != x.size:
        raise TLRewardError(f"{len(units)} unit labels for {x.size} items")
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    labels = None if units is None else np.asarray(units)[keep]
    if x.size < 4:
        raise TLRewardError(f"rank agreement needs at least 4 items without NaN, got {x.size}")
    idx = bootstrap_indices(x.size, n_bootstrap, seed, labels)
    over = "items" if units is None else f"{unit}s"
    p_values = {"kendall_tau_b": kendall_tau_b(x, y).p_value,
                "spearman_rho": spearman_rho(x, y).p_value}
    out = {}
    for name, fn in RANK_STATS.items():
        boot = np.array([fn(x[i], y[i], rbo_p) for i in idx])
        out[name] = Estimate(fn(x, y, rbo_p), *percentile_ci(boot, confidence),
                             p_values.get(name, float("nan")), int(x.size),
                             f"percentile bootstrap over {over}" + (
                                 "; rank test" if name in p_values else ""), confidence)
    return RankAgreement(**out, x=x, y=y, model_a=names[0], model_b=names[1])
