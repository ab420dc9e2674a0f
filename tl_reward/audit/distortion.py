"""Distortion index: how unevenly the reward responds to the probed value dimensions.

Ours, in absolute units. The *sensitivity* of dimension k is ``s_k = mean_i(delta_ik) / sd(r
on natural replies)``: how far the edit moves the reward, in units of the reward's own spread
over the unedited replies of the same base items. The *index* is the Gini coefficient of
``|s_k|``, ``G = sum_jk |a_j - a_k| / (2 K^2 mean(a))``: 0 only when the *estimated* ``|s_k|``
are exactly equal, ``1 - 1/K`` when one dimension alone moves the reward (bounded and robust to
one large dimension; the coefficient of variation is also reported). No interval is reported
for the sensitivities, the index or the CV (NaN; ``ci_reason`` says why): a ratio to an
estimated sd has none that reaches its coverage (docs/statistics.md).

**The index has a noise floor.** Gini is scale-free, so noise alone makes the ``|s_k|``
unequal: a model indifferent to every edit gets about 0.3 at K = 7 whatever the noise's size.
The index is reported against its null, "no dimension moves the reward": the index under sign
flips of whole item rows (correlations between dimensions kept; exact over all ``2^n`` patterns
for small n, else Monte Carlo), with ``excess = index - null median`` and the one-sided
``p_value``; "distortion above floor" only when ``p_value < alpha``. Dimensions that all move
the reward strongly but evenly can fall below the floor: read the sensitivities for that. The
published index: :mod:`tl_reward.compat.published`.

Example:
    >>> res = distortion_index(report)            # report: a ProbeReport
    >>> res.index, res.sensitivity                # Gini of |sensitivity|, the sensitivities
    >>> res.null_median, res.excess, res.p_value, res.above_floor
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tl_reward.errors import TLRewardError
from tl_reward.results import ShortRepr
from tl_reward.stats.paired import NO_RATIO_INTERVAL


def gini(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Gini coefficient of ``|values|`` along ``axis`` (NaN when all are 0), O(K log K):
    ``sum_i (2i - K - 1) a_(i) / (K sum a)`` over the sorted ``a``, which equals
    ``sum_jk |a_j - a_k| / (2 K^2 mean(a))``."""
    a = np.sort(np.abs(np.moveaxis(np.asarray(values, dtype=np.float64), axis, -1)), -1)
    k = a.shape[-1]
    total = a.sum(-1)
    weighted = (a * (2 * np.arange(1, k + 1) - k - 1)).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, weighted / (k * total), np.nan)


#: Largest n whose ``2^n`` item sign patterns the floor test enumerates by default.
FLOOR_EXACT_MAX_N = 12


@dataclass(frozen=True)
class FloorTest:
    """The distortion index against its noise floor, per data set (arrays over a batch).

    Attributes:
        index: Gini of the ``|column means|`` (the sd scale cancels in Gini).
        null_median, null_high: median and 95th percentile of the index under the null.
        p_value: one-sided, ``P(null index >= index)``; method: ``"exact"`` or
            ``"monte_carlo"``; n_permutations: sign patterns used.
    """

    index: np.ndarray
    null_median: np.ndarray
    null_high: np.ndarray
    p_value: np.ndarray
    method: str
    n_permutations: int


def distortion_floor_test(deltas: np.ndarray, n_permutations: int = 9_999,
                          exact_max_n: int = FLOOR_EXACT_MAX_N, seed: int = 0) -> FloorTest:
    """Sign-flip test of "the index is above its noise floor" on ``deltas [..., n, K]`` (items
    x dimensions, NaN where an edit did not apply; leading axes are independent data sets
    tested with the same sign patterns).

    Null: every dimension's mean delta is 0 and each item's row of deltas is symmetric about 0
    (jointly, so correlated dimensions are fine). Each pattern multiplies whole item rows by
    +-1; the index of the flipped column means is the reference. Exact over all ``2^n``
    patterns when ``n <= exact_max_n`` (``p = #{null >= obs} / 2^n``), else ``n_permutations``
    random patterns with ``p = (1 + #{null >= obs}) / (1 + n_permutations)``.
    """
    d = np.asarray(deltas, dtype=np.float64)
    if d.ndim < 2:
        raise TLRewardError("deltas must be [..., items, dimensions]")
    n = d.shape[-2]
    present = ~np.isnan(d)
    counts = present.sum(-2)[..., None, :]  # [..., 1, K]
    d0 = np.where(present, d, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        obs = gini(d0.sum(-2) / counts[..., 0, :])
    if n <= exact_max_n:
        pats = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2.0 - 1  # [2^n, n]
        method, b_total = "exact", 2**n
    else:
        pats, method, b_total = None, "monte_carlo", n_permutations
    rng = np.random.default_rng(seed)
    step = max(1, min(b_total, 2_000_000 // max(1, n * d0[..., 0, :].size)))
    null = []
    for start in range(0, b_total, step):
        b = min(step, b_total - start)
        s = pats[start:start + b] if pats is not None else (
            rng.integers(0, 2, size=(b, n)) * 2.0 - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            null.append(gini(np.einsum("bn,...nk->...bk", s, d0) / counts))
    null_idx = np.concatenate(null, -1)  # [..., B]
    tol = 1e-12 * np.maximum(np.abs(obs), 1.0)
    ge = (null_idx >= (obs - tol)[..., None]).sum(-1)
    p = ge / b_total if method == "exact" else (1 + ge) / (1 + b_total)
    with np.errstate(invalid="ignore"):
        med, high = np.nanquantile(null_idx, [0.5, 0.95], axis=-1)
    return FloorTest(obs, med, high, np.where(np.isnan(obs), np.nan, p), method, b_total)


def coefficient_of_variation(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """``sd / mean`` (ddof 0) of ``|values|`` along ``axis`` (NaN when the mean is 0)."""
    a = np.abs(np.asarray(values, dtype=np.float64))
    mean = a.mean(axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean > 0, a.std(axis) / mean, np.nan)


@dataclass(repr=False)
class DistortionResult(ShortRepr):
    """Sensitivity per dimension (natural-sd units), the unevenness index and its noise floor.

    Attributes:
        dimensions: the K dimensions; n_items: base items (matched across dimensions).
        sensitivity: ``s_k`` per dimension; ci_low, ci_high: NaN (no interval, ``ci_reason``).
        index: Gini of ``|s|``; cv: coefficient of variation; index_ci, cv_ci: NaN pairs.
        natural_sd: the sd of ``r`` on natural replies the sensitivities are divided by.
        null_median, null_high: median and 95th percentile of the index when no dimension
            moves the reward (item sign flips); excess: ``index - null_median``.
        p_value: one-sided p of "the index is above its noise floor"; alpha: the level;
        null_method: ``"exact"`` or ``"monte_carlo"``; n_permutations: sign patterns used.
    """

    dimensions: list[str]
    n_items: int
    sensitivity: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    index: float
    index_ci: tuple[float, float]
    cv: float
    cv_ci: tuple[float, float]
    natural_sd: float
    null_median: float = float("nan")
    null_high: float = float("nan")
    p_value: float = float("nan")
    alpha: float = 0.05
    null_method: str = ""
    n_permutations: int = 0
    ci_reason: str = NO_RATIO_INTERVAL

    @property
    def excess(self) -> float:
        """``index - null_median``: the unevenness beyond what noise alone gives."""
        return self.index - self.null_median

    @property
    def above_floor(self) -> bool:
        """The verdict "distortion above floor": ``p_value < alpha``."""
        return bool(self.p_value < self.alpha)

    @property
    def verdict(self) -> str:
        return ("distortion above floor" if self.above_floor
                else "not distinguishable from the noise floor")

    def to_dataframe(self) -> pd.DataFrame:
        """One row per dimension: sensitivity, its CI and its share of ``sum |s|``."""
        a = np.abs(self.sensitivity)
        return pd.DataFrame({"dimension": self.dimensions, "sensitivity": self.sensitivity,
                             "ci_low": self.ci_low, "ci_high": self.ci_high,
                             "share": a / a.sum() if a.sum() > 0 else np.nan})

    def summary(self) -> pd.DataFrame:
        """One row: the index with its CI, its null (median, 95th percentile), the excess,
        the p-value and the verdict."""
        return pd.DataFrame([{
            "index": self.index, "ci_low": self.index_ci[0], "ci_high": self.index_ci[1],
            "null_median": self.null_median, "null_high": self.null_high,
            "excess": self.excess, "p_value": self.p_value, "alpha": self.alpha,
            "verdict": self.verdict, "n_items": self.n_items,
            "null_method": self.null_method, "n_permutations": self.n_permutations}])

    def plot(self) -> Any:
        """Bar chart of the sensitivities with CIs; the index, its null and p in the title."""
        from tl_reward.viz.audit import distortion_chart

        return distortion_chart(self)


def distortion_index(report: Any, natural: pd.Series | np.ndarray | None = None,
                     seed: int = 0, n_permutations: int = 9_999, alpha: float = 0.05
                     ) -> DistortionResult:
    """:class:`DistortionResult` of a :class:`~tl_reward.audit.probes.ProbeReport` (or of an
    items x dimensions delta DataFrame plus the natural rewards of the same items).

    ``n_permutations``: item sign patterns of the noise-floor test
    (:func:`distortion_floor_test`; exact for n <= 12); ``alpha``: the level of the
    "distortion above floor" verdict."""
    mat = report.delta_matrix() if hasattr(report, "delta_matrix") else report
    if not isinstance(mat, pd.DataFrame):
        raise TLRewardError("pass a ProbeReport or an items x dimensions DataFrame of deltas")
    if natural is None:
        if not hasattr(report, "natural_rewards"):
            raise TLRewardError("pass the natural rewards of the items (natural=...) to scale "
                                "the sensitivities")
        natural = report.natural_rewards()
    nat = (natural.reindex(mat.index) if isinstance(natural, pd.Series)
           else pd.Series(np.asarray(natural, dtype=np.float64), index=mat.index))
    if nat.isna().any():
        raise TLRewardError("every item needs its natural reward")
    d = mat.to_numpy(np.float64)
    r = nat.to_numpy(np.float64)
    n, k = d.shape
    if n < 3 or k < 2:
        raise TLRewardError(f"need >= 3 items and >= 2 dimensions, got {n} x {k}")
    sd = float(r.std(ddof=1))
    if not sd > 0:
        raise TLRewardError("the natural rewards have zero spread; sensitivities are undefined")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a dimension with no applied edit
        sens = np.nanmean(d, 0) / sd
    none, nan2 = np.full(k, np.nan), (float("nan"), float("nan"))
    floor = distortion_floor_test(d, n_permutations, seed=seed)
    return DistortionResult(list(mat.columns), n, sens, none, none, float(gini(sens)), nan2,
                            float(coefficient_of_variation(sens)), nan2, sd,
                            float(floor.null_median), float(floor.null_high),
                            float(floor.p_value), alpha, floor.method, floor.n_permutations)
