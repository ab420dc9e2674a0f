"""How far an implicit reward agrees with an explicit one: on pairs, on a corpus, on tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tl_reward.errors import TLRewardError
from tl_reward.stats.ranks import kendall_tau_b, spearman_rho


def _bootstrap(n: int, stat: Any, n_resamples: int, seed: int,
               groups: Any = None) -> tuple[float, float]:
    """Percentile 95% CI of ``stat(idx)`` over resamples ``idx``: of the ``n`` items, or, with
    ``groups`` (one label per item), of the groups (a cluster bootstrap: draw as many groups as
    there are, with replacement, and keep every item of each draw). Groups are numbered in
    order of first appearance, so one item per group draws exactly the item bootstrap."""
    rng = np.random.default_rng(seed)
    if groups is not None:
        codes, _ = pd.factorize(np.asarray(groups))
        if codes.size != n:
            raise TLRewardError(f"{codes.size} group labels for {n} items")
        order = np.argsort(codes, kind="stable")  # each group's items, in input order
        counts = np.bincount(codes)
        starts = np.cumsum(counts) - counts

    def draw() -> np.ndarray:
        if groups is None:
            return rng.integers(0, n, n)
        picked = rng.integers(0, len(counts), len(counts))
        lens = counts[picked]
        shift = np.repeat(starts[picked] - (np.cumsum(lens) - lens), lens)
        return order[shift + np.arange(lens.sum())]

    vals = np.array([stat(draw()) for _ in range(n_resamples)])
    vals = vals[~np.isnan(vals)]
    if vals.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.quantile(vals, [0.025, 0.975])
    return float(lo), float(hi)


@dataclass
class PairAgreement:
    """Share of preference pairs on which the implicit reward prefers the explicit reward's
    choice (ties count one half), with a 95% percentile-bootstrap CI over pairs."""

    share: float
    ci_low: float
    ci_high: float
    n: int
    margins: np.ndarray

    def __str__(self) -> str:
        return f"{self.share:.3f} [{self.ci_low:.3f}, {self.ci_high:.3f}] (n = {self.n})"

    def to_dataframe(self) -> pd.DataFrame:
        """One row per pair: the implicit margin (chosen minus rejected) and agreement."""
        return pd.DataFrame({"implicit_margin": self.margins,
                             "agrees": np.sign(self.margins) > 0})

    def plot(self) -> Any:
        """Histogram of the implicit margins (plotly)."""
        import plotly.express as px

        return px.histogram(x=self.margins, nbins=30, title=f"Implicit margin on pairs the "
                            f"explicit reward orders; agreement {self}",
                            labels={"x": "r_imp(chosen) - r_imp(rejected)"})


def pair_agreement(chosen: np.ndarray, rejected: np.ndarray, n_resamples: int = 2000,
                   seed: int = 0) -> PairAgreement:
    """Agreement of implicit rewards with pairs ordered by an explicit reward (chosen first)."""
    c, r = np.asarray(chosen, dtype=np.float64), np.asarray(rejected, dtype=np.float64)
    if c.shape != r.shape or c.ndim != 1 or c.size < 2:
        raise TLRewardError("chosen and rejected must be 1-D arrays of the same length >= 2")
    m = c - r
    score = np.where(m > 0, 1.0, np.where(m < 0, 0.0, 0.5))
    lo, hi = _bootstrap(m.size, lambda i: score[i].mean(), n_resamples, seed)
    return PairAgreement(float(score.mean()), lo, hi, int(m.size), m)


@dataclass
class RankAgreement:
    """Kendall tau-b (95% bootstrap CI over ``unit``: items, or the groups items belong to)
    and Spearman rho of two rewards."""

    kendall_tau_b: float
    ci_low: float
    ci_high: float
    kendall_pvalue: float
    spearman_rho: float
    n: int
    x: np.ndarray
    y: np.ndarray
    x_label: str = "implicit reward"
    y_label: str = "explicit reward"
    unit: str = "item"

    def __str__(self) -> str:
        return (f"tau_b {self.kendall_tau_b:.3f} [{self.ci_low:.3f}, {self.ci_high:.3f}], "
                f"rho {self.spearman_rho:.3f} (n = {self.n}, resampling {self.unit}s)")

    def to_dataframe(self) -> pd.DataFrame:
        """One row per item: the two values."""
        return pd.DataFrame({self.x_label: self.x, self.y_label: self.y})

    def plot(self) -> Any:
        """Scatter of the two rewards (plotly)."""
        from tl_reward.viz.irm import plot_reward_scatter

        return plot_reward_scatter(self.x, self.y, self.x_label, self.y_label,
                                   f"Kendall tau-b {self.kendall_tau_b:.3f}")


def rank_agreement(x: np.ndarray, y: np.ndarray, n_resamples: int = 1000, seed: int = 0,
                   x_label: str = "implicit reward", y_label: str = "explicit reward",
                   groups: Any = None, unit: str = "group") -> RankAgreement:
    """Rank agreement of two rewards on the same items (NaN items dropped).

    ``groups``: one label per item when items are not independent (e.g. the tokens of one
    word); the CI then resamples whole groups (a cluster bootstrap), the unit named ``unit``.
    Resample by the unit that is independent: near-duplicate items resampled one by one give
    a CI too narrow by about the square root of the items per group."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if groups is not None and len(groups) != a.size:
        raise TLRewardError(f"{len(groups)} group labels for {a.size} items")
    keep = ~(np.isnan(a) | np.isnan(b))
    a, b = a[keep], b[keep]
    if a.size < 3:
        raise TLRewardError(f"rank agreement needs at least 3 items, got {a.size}")
    g = None if groups is None else np.asarray(groups)[keep]
    tau = kendall_tau_b(a, b)
    lo, hi = _bootstrap(a.size, lambda i: kendall_tau_b(a[i], b[i]).statistic, n_resamples,
                        seed, g)
    return RankAgreement(tau.statistic, lo, hi, tau.p_value, spearman_rho(a, b).statistic,
                         int(a.size), a, b, x_label, y_label,
                         "item" if groups is None else unit)
