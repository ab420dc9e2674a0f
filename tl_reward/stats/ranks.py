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
