"""Rank agreement for long rankings: Kendall's tau-b, Spearman's rho, rank-biased overlap.

Vocabulary sweeps rank 50k-256k tokens, so everything here is O(n log n) (no n x n matrices).
Kendall is ``scipy.stats.kendalltau``; Spearman matches ``spearmanr`` with an exact permutation p
for ``n <= SPEARMAN_EXACT_MAX_N``; rank-biased overlap is Webber, Moffat & Zobel (2010), the
extrapolated form (their eq. 32) with persistence ``p``.

Example:
    >>> kendall_tau_b(scores_a, scores_b).statistic
    >>> rank_biased_overlap(ranked_a, ranked_b, p=0.9)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import special, stats

from tl_reward.errors import TLRewardError

ArrayLike = np.ndarray | torch.Tensor | Sequence[float]


def as_array(x: ArrayLike) -> np.ndarray:
    """``x`` as a float64 numpy array (a tensor detached and moved to the CPU)."""
    return (x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor)
            else np.asarray(x, dtype=np.float64))


@dataclass(frozen=True)
class RankCorrelation:
    """A rank correlation with its two-sided p-value and sample size."""

    statistic: float
    p_value: float
    n: int


def paired_arrays(a: ArrayLike, b: ArrayLike, min_n: int = 0, what: str = "value"
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``a`` and ``b`` as 1-D float64 arrays of equal length, at least ``min_n`` (else a
    :class:`~tl_reward.errors.TLRewardError`, a ``ValueError``)."""
    x, y = as_array(a), as_array(b)
    if x.shape != y.shape or x.ndim != 1 or x.size < min_n:
        raise TLRewardError(f"need two 1-D {what} arrays of equal length (at least {min_n}), got "
                            f"{x.shape} and {y.shape}")
    return x, y


def _pair(a: ArrayLike, b: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    x, y = paired_arrays(a, b)
    if np.isnan(x).any() or np.isnan(y).any():
        raise ValueError("rank statistics need finite values; drop NaNs first")
    return x, y


def average_ranks(x: ArrayLike) -> np.ndarray:
    """1-based ranks along the last axis, ties sharing their average rank:
    ``scipy.stats.rankdata(x, axis=-1)``, O(n log n) time and O(n) memory per row."""
    return stats.rankdata(as_array(x), axis=-1)


def kendall_tau_b(a: ArrayLike, b: ArrayLike) -> RankCorrelation:
    """Kendall's tau-b with ties and its p: ``scipy.stats.kendalltau`` (O(n log n); the p is
    exact for untied samples with ``n <= 33``, else asymptotic)."""
    x, y = _pair(a, b)
    if len(x) < 2:
        return RankCorrelation(float("nan"), float("nan"), len(x))
    res = stats.kendalltau(x, y)
    return RankCorrelation(float(res.statistic), float(res.pvalue), len(x))


def concordance(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per item ``i``: ``sum_j sign(x_i - x_j) sign(y_i - y_j)`` (ties 0), by a Fenwick tree
    over ``y``'s ranks in two sweeps of ``x`` (O(n log n) time, O(n) memory)."""
    n = len(x)
    ry = stats.rankdata(y, method="dense").astype(np.int64)
    out = np.zeros(n, dtype=np.int64)
    for sign, order in ((1, np.argsort(x, kind="stable")), (-1, np.argsort(-x, kind="stable"))):
        tree = np.zeros(int(ry.max()) + 1, dtype=np.int64)
        xs, done, k = x[order], 0, 0
        while k < n:
            e = int(np.searchsorted(xs, xs[k], side="right")) if sign == 1 else int(
                np.searchsorted(-xs, -xs[k], side="right"))
            for i in order[k:e]:  # earlier items: x below (sign 1) or above (sign -1) x_i
                below = at_or_below = 0
                j = int(ry[i]) - 1
                while j > 0:
                    below += tree[j]
                    j -= j & -j
                j = int(ry[i])
                while j > 0:
                    at_or_below += tree[j]
                    j -= j & -j
                out[i] += sign * (below - (done - at_or_below))
            for i in order[k:e]:
                j = int(ry[i])
                while j < len(tree):
                    tree[j] += 1
                    j += j & -j
            done, k = done + e - k, e
    return out


#: Smallest number of independent units for which :func:`kendall_interval` gives an interval.
KENDALL_MIN_N = 8


def kendall_interval(x: ArrayLike, y: ArrayLike, tau_b: float, confidence: float = 0.95,
                     units: np.ndarray | None = None) -> tuple[float, float, str]:
    """``(low, high, reason)``: the interval of Kendall's tau-b on the Fisher-z scale with the
    U-statistic (Hoeffding) variance, ``4 / n^2 * U / (U - 1) * sum_u d_u^2 + 2 (1 - tau^2) /
    (n (n - 1))`` with ``d_u`` the summed centred concordances of unit ``u`` (one unit per item
    without ``units``: a cluster-robust variance with them), scaled by tau-b's tie correction.
    Distribution-free: simulated coverage (``tests/stats/test_correlation_intervals.py``) at
    least nominal from ``KENDALL_MIN_N`` units, normal and bivariate-t(3) data; NaN below that
    and at ``|tau| = 1`` (``reason`` says why, else ``""``)."""
    a, b = as_array(x), as_array(y)
    n = len(a)
    codes = np.arange(n) if units is None else np.unique(units, return_inverse=True)[1]
    n_units = int(codes.max()) + 1 if n else 0
    if n_units < KENDALL_MIN_N:
        return math.nan, math.nan, (f"no interval below {KENDALL_MIN_N} independent units "
                                    f"(got {n_units})")
    if not abs(tau_b) < 1:
        return math.nan, math.nan, "no interval at |tau| = 1"
    c = concordance(a, b) / (n - 1)
    tau_a = float(c.mean())
    d = np.bincount(codes, weights=c - tau_a)
    var_a = 4 / n**2 * n_units / (n_units - 1) * float((d**2).sum()) + 2 * (1 - tau_a**2) / (
        n * (n - 1))
    pairs = n * (n - 1) / 2  # tau-b = tau-a * pairs / sqrt((pairs - tied x) (pairs - tied y))
    tied = [float((t * (t - 1) / 2).sum()) for t in (np.unique(v, return_counts=True)[1]
                                                      for v in (a, b))]
    se_z = math.sqrt(var_a) * pairs / math.sqrt((pairs - tied[0]) * (pairs - tied[1])) / (
        1 - tau_b**2)
    q = float(stats.norm.ppf(0.5 + confidence / 2))
    z = math.atanh(tau_b)
    return math.tanh(z - q * se_z), math.tanh(z + q * se_z), ""


#: Largest ``n`` for which ``spearman_rho`` enumerates all ``n!`` permutations (40,320).
SPEARMAN_EXACT_MAX_N = 8


def spearman_rho(a: ArrayLike, b: ArrayLike) -> RankCorrelation:
    """Spearman's rho (Pearson on average ranks) with a two-sided p-value.

    ``n <= SPEARMAN_EXACT_MAX_N``: exact permutation p, ``#{|rho*| >= |rho|} / n!`` over every
    permutation of ``b``. Beyond: scipy's t-distribution p, except at ``|rho| = 1`` where that
    p is 0; there the exact permutation p is used: a random permutation reaches rho = +1 (or -1)
    only by reproducing one rank vector, which ``prod(t_j!)`` of the ``n!`` permutations do
    (``t_j`` the tie sizes of ``b``).
    """
    x, y = _pair(a, b)
    n = len(x)
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float((rx**2).sum() * (ry**2).sum()))
    if n < 3 or den == 0:
        return RankCorrelation(float("nan"), float("nan"), n)
    rho = float(np.clip((rx * ry).sum() / den, -1.0, 1.0))
    if n <= SPEARMAN_EXACT_MAX_N:
        perms = np.array(list(itertools.permutations(range(n))))
        null = np.abs(ry[perms] @ rx) / den
        return RankCorrelation(rho, float((null >= abs(rho) - 1e-12).mean()), n)
    dof = n - 2
    if np.allclose(ry, rx) or np.allclose(ry, -rx):  # |rho| = 1 up to rounding
        rho = math.copysign(1.0, rho)
        # rank vectors reached at |rho| = 1: rx itself, and its reflection if ry's ranks allow it
        ways = 1 + int(np.array_equal(np.sort(-rx), np.sort(rx)))
        ties = np.unique(y, return_counts=True)[1]  # lgamma(2) = 0: untied values add 0
        log_p = sum(math.lgamma(t + 1) for t in ties) - math.lgamma(n + 1)
        return RankCorrelation(rho, float(min(1.0, ways * math.exp(log_p))), n)
    t = rho * math.sqrt(dof / ((1.0 - rho) * (1.0 + rho)))
    return RankCorrelation(rho, float(2 * special.stdtr(dof, -abs(t))), n)


def rank_biased_overlap(a: Sequence[Hashable] | np.ndarray, b: Sequence[Hashable] | np.ndarray,
                        p: float = 0.9, depth: int | None = None) -> float:
    """Extrapolated rank-biased overlap of two rankings (best first), Webber et al. eq. 32.

    ``RBO = (X_k / k) p^k + (1 - p) / p * sum_{d=1..k} (X_d / d) p^d`` where ``X_d`` is the
    number of items shared by the two top-``d`` lists and ``k`` the evaluation depth (default:
    the shorter list). 1 for identical rankings, 0 for disjoint ones; with ``p = 0.9`` the top
    10 items carry about 86 % of the weight.
    """
    if not 0 < p < 1:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    la, lb = list(a), list(b)
    k = min(len(la), len(lb)) if depth is None else min(depth, len(la), len(lb))
    if k == 0:
        raise ValueError("rank-biased overlap needs two non-empty rankings")
    if len(set(la[:k])) != k or len(set(lb[:k])) != k:
        raise ValueError("rankings must not repeat an item")
    pos_b = {item: i for i, item in enumerate(lb[:k])}
    # an item of a's top-k counts from depth max(pos_a, pos_b) + 1 on
    first = np.array([max(i, pos_b[item]) for i, item in enumerate(la[:k]) if item in pos_b],
                     dtype=np.int64)
    overlap = np.cumsum(np.bincount(first, minlength=k)[:k])  # X_d for d = 1..k
    d = np.arange(1, k + 1, dtype=np.float64)
    agreement = overlap / d
    return float(agreement[-1] * p**k + (1 - p) / p * (agreement * p**d).sum())


def top_ranking(ids: Sequence[Hashable] | np.ndarray, values: ArrayLike,
                largest: bool = True) -> list[Hashable]:
    """``ids`` ordered by ``values``, best first (ties keep ``ids`` order), for RBO."""
    v = as_array(values)
    order = np.argsort(-v if largest else v, kind="mergesort")
    arr = list(ids)
    return [arr[i] for i in order]
