"""Rank agreement for long rankings: Kendall's tau-b, Spearman's rho, rank-biased overlap.

Vocabulary sweeps rank 50k-256k tokens, so everything here is O(n log n) in numpy (no n x n
matrices). Kendall and Spearman match ``scipy.stats.kendalltau`` / ``spearmanr`` (statistic, ties
handled); Kendall's p is scipy's ``method="auto"`` one (exact for small untied samples), and
Spearman's is an exact permutation p for ``n <= SPEARMAN_EXACT_MAX_N``; rank-biased overlap is
Webber, Moffat & Zobel (2010), the extrapolated form (their eq. 32) with persistence ``p``.

Example:
    >>> kendall_tau_b(scores_a, scores_b).statistic
    >>> rank_biased_overlap(ranked_a, ranked_b, p=0.9)
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import special, stats

ArrayLike = np.ndarray | torch.Tensor | Sequence[float]


@dataclass(frozen=True)
class RankCorrelation:
    """A rank correlation with its two-sided p-value and sample size (``pvalue``: deprecated
    alias of ``p_value``)."""

    statistic: float
    p_value: float
    n: int

    @property
    def pvalue(self) -> float:
        """Deprecated alias of :attr:`p_value`."""
        warnings.warn("RankCorrelation.pvalue is deprecated; use p_value", DeprecationWarning,
                      stacklevel=2)
        return self.p_value


def _pair(a: ArrayLike, b: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    x = a.detach().cpu().double().numpy() if isinstance(a, torch.Tensor) else np.asarray(
        a, dtype=np.float64)
    y = b.detach().cpu().double().numpy() if isinstance(b, torch.Tensor) else np.asarray(
        b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"need two 1-D arrays of equal length, got {x.shape} and {y.shape}")
    if np.isnan(x).any() or np.isnan(y).any():
        raise ValueError("rank statistics need finite values; drop NaNs first")
    return x, y


def average_ranks(x: ArrayLike) -> np.ndarray:
    """1-based ranks along the last axis, ties sharing their average rank (as
    ``scipy.stats.rankdata(x, axis=-1)``); O(n log n) time and O(n) memory per row."""
    v = x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(
        x, dtype=np.float64)
    n = v.shape[-1]
    order = np.argsort(v, axis=-1, kind="mergesort")
    sorted_v = np.take_along_axis(v, order, -1)
    idx = np.arange(n)
    diff = sorted_v[..., 1:] != sorted_v[..., :-1]
    first = np.concatenate([np.ones_like(diff[..., :1]), diff], -1)  # a tie group starts
    last = np.concatenate([diff, np.ones_like(diff[..., :1])], -1)   # a tie group ends
    start = np.maximum.accumulate(np.where(first, idx, 0), axis=-1)
    end = np.flip(np.minimum.accumulate(np.flip(np.where(last, idx, n), -1), axis=-1), -1)
    ranks = np.empty(v.shape)
    np.put_along_axis(ranks, order, (start + end) / 2.0 + 1.0, -1)  # mean of start+1 .. end+1
    return ranks


def _tie_sizes(v: np.ndarray) -> np.ndarray:
    _, counts = np.unique(v, return_counts=True)
    return counts[counts > 1].astype(np.float64)


def _count_inversions(y: np.ndarray) -> int:
    """Pairs i < j with ``y[i] > y[j]`` (strictly), by bottom-up merging, vectorised."""
    n = len(y)
    if n < 2:
        return 0
    _, dense = np.unique(y, return_inverse=True)  # integer codes preserve order and ties
    vals = dense.astype(np.int64)
    total = 0
    width = 1
    idx = np.arange(n)
    while width < n:
        block = idx // (2 * width)
        is_right = (idx // width) % 2 == 1
        key = block * (n + 1) + vals  # values sorted within each block of width `width`
        left_keys = key[~is_right]
        right = is_right
        # for each right element: left elements of the same block that are strictly greater
        upper = np.searchsorted(left_keys, block[right] * (n + 1) + n, side="right")
        below = np.searchsorted(left_keys, key[right], side="right")
        total += int((upper - below).sum())
        vals = vals[np.lexsort((vals, block))]  # merge: sort within the doubled blocks
        width *= 2
    return total


def kendall_tau_b(a: ArrayLike, b: ArrayLike) -> RankCorrelation:
    """Kendall's tau-b with ties, in O(n log n) (Knight's method), and scipy's ``auto`` p.

    The p is exact (scipy's null distribution of the discordant count) when neither ranking has
    ties and ``n <= 33`` or at most one pair is discordant or concordant; otherwise asymptotic.
    """
    x, y = _pair(a, b)
    n = len(x)
    if n < 2:
        return RankCorrelation(float("nan"), float("nan"), n)
    order = np.lexsort((y, x))
    x, y = x[order], y[order]
    n0 = n * (n - 1) // 2
    tx, ty = _tie_sizes(x), _tie_sizes(y)
    n1 = int((tx * (tx - 1) / 2).sum())
    n2 = int((ty * (ty - 1) / 2).sum())
    xy = np.unique(np.stack([x, y], 1), axis=0, return_counts=True)[1].astype(np.float64)
    n3 = int((xy * (xy - 1) / 2).sum())
    dis = _count_inversions(y)  # pairs tied in x are sorted by y, so never counted
    con_minus_dis = n0 - n1 - n2 + n3 - 2 * dis
    den = math.sqrt((n0 - n1) * (n0 - n2))
    if den == 0:
        return RankCorrelation(float("nan"), float("nan"), n)
    tau = con_minus_dis / den
    var = ((n * (n - 1) * (2 * n + 5) - (tx * (tx - 1) * (2 * tx + 5)).sum()
            - (ty * (ty - 1) * (2 * ty + 5)).sum()) / 18
           + (tx * (tx - 1)).sum() * (ty * (ty - 1)).sum() / (2 * n * (n - 1))
           + ((tx * (tx - 1) * (tx - 2)).sum() * (ty * (ty - 1) * (ty - 2)).sum()
              / (9 * n * (n - 1) * (n - 2)) if n > 2 else 0.0))
    tau = float(min(1.0, max(-1.0, tau)))
    if tx.size == 0 and ty.size == 0 and (n <= 33 or min(dis, n0 - dis) <= 1):
        return RankCorrelation(tau, float(stats.kendalltau(x, y, method="exact").pvalue), n)
    z = con_minus_dis / math.sqrt(var)
    return RankCorrelation(tau, float(special.erfc(abs(z) / 2**0.5)), n)


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
        log_p = sum(math.lgamma(t + 1) for t in _tie_sizes(y)) - math.lgamma(n + 1)
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
    weights = p ** d
    return float(agreement[-1] * p**k + (1 - p) / p * (agreement * weights).sum())


def top_ranking(ids: Sequence[Hashable] | np.ndarray, values: ArrayLike,
                largest: bool = True) -> list[Hashable]:
    """``ids`` ordered by ``values``, best first (ties keep ``ids`` order), for RBO."""
    v = values.detach().cpu().double().numpy() if isinstance(values, torch.Tensor) else np.asarray(
        values, dtype=np.float64)
    order = np.argsort(-v if largest else v, kind="mergesort")
    arr = list(ids)
    return [arr[i] for i in order]
