"""Resampling statistics: bootstrap confidence intervals, sign-flip permutation tests, and the
Spearman rank correlation the faithfulness report averages.

Example:
    >>> x = np.array([0.2, 0.5, -0.1, 0.4])
    >>> bootstrap_ci(x)                  # (low, high) of the mean, 95 %
    >>> sign_flip_pvalue(x)              # two-sided p for mean != 0
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from tl_reward.stats.ranks import average_ranks

ArrayLike = np.ndarray | torch.Tensor | list[float]


def _array(x: ArrayLike) -> np.ndarray:
    arr = x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(
        x, dtype=np.float64)
    return arr


def spearman(a: Float[torch.Tensor, "... n"], b: Float[torch.Tensor, "... n"]
             ) -> Float[torch.Tensor, "..."]:
    """Spearman's rho along the last axis (NaN where either side is constant), float64.

    Ranks from :func:`tl_reward.stats.ranks.average_ranks`: O(n log n), O(n) memory per row.
    """
    ra, rb = average_ranks(a), average_ranks(b)
    ra = ra - ra.mean(-1, keepdims=True)
    rb = rb - rb.mean(-1, keepdims=True)
    den = np.sqrt((ra**2).sum(-1) * (rb**2).sum(-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(den > 0, (ra * rb).sum(-1) / den, np.nan)
    return torch.as_tensor(out, dtype=torch.float64, device=a.device)


def bootstrap_ci(
    x: ArrayLike,
    statistic: Callable[[np.ndarray], np.ndarray] | None = None,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of ``statistic`` (default: the mean) over the values ``x``.

    ``statistic`` maps ``[n_resamples, n]`` to ``[n_resamples]`` (vectorised). NaNs are dropped.
    """
    arr = _array(x)
    arr = arr[~np.isnan(arr)]
    if arr.size < 2:
        return float("nan"), float("nan")
    stat = statistic or (lambda a: a.mean(-1))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(n_resamples, arr.size))
    boot = stat(arr[idx])
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    return float(lo), float(hi)


def sign_flip_pvalue(
    x: ArrayLike, n_resamples: int = 9_999, seed: int = 0, exact_max_n: int = 20
) -> float:
    """Two-sided sign-flip p-value for ``mean(x) != 0``: the p-value of
    :func:`tl_reward.stats.paired.sign_flip_test` (exact for ``n <= exact_max_n``, else Monte
    Carlo with ``(1 + count) / (1 + n_resamples)``)."""
    from tl_reward.stats.paired import sign_flip_test

    return sign_flip_test(x, exact_max_n, n_resamples, seed).p_value


@dataclass
class MeanSummary:
    """Mean of per-item values with a bootstrap CI and a sign-flip p-value."""

    mean: float
    ci_low: float
    ci_high: float
    p_value: float
    n: int

    def __str__(self) -> str:
        return (f"{self.mean:+.3f} [{self.ci_low:+.3f}, {self.ci_high:+.3f}] "
                f"(p = {self.p_value:.3g}, n = {self.n})")


def summarise_mean(x: ArrayLike, n_resamples: int = 10_000, confidence: float = 0.95,
                   seed: int = 0) -> MeanSummary:
    """:class:`MeanSummary` of the non-NaN values of ``x``."""
    arr = _array(x)
    arr = arr[~np.isnan(arr)]
    mean = float(arr.mean()) if arr.size else float("nan")
    lo, hi = bootstrap_ci(arr, n_resamples=n_resamples, confidence=confidence, seed=seed)
    return MeanSummary(mean, lo, hi, sign_flip_pvalue(arr, n_resamples, seed), int(arr.size))
