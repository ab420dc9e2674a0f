"""Resampling statistics: the one bootstrap (items or whole units), sign-flip tests, and the
Spearman rank correlation the faithfulness report averages.

Example:
    >>> x = np.array([0.2, 0.5, -0.1, 0.4])
    >>> bootstrap_ci(x)                  # (low, high) of the mean, 95 %
    >>> sign_flip_pvalue(x)              # two-sided p for mean != 0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.stats.estimate import Estimate
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


def bootstrap_indices(n: int, n_bootstrap: int = 2000, seed: int = 0,
                      units: ArrayLike | Sequence[Any] | None = None
                      ) -> np.ndarray | list[np.ndarray]:
    """The one bootstrap's resamples of ``n`` items (seeded).

    Without ``units``: ``[n_bootstrap, n]`` item indices drawn with replacement. With ``units``
    (one label per item, e.g. the word a token belongs to), whole units are drawn with
    replacement, as many as there are units, and each resample is the indices of all their
    items (a cluster bootstrap): a list of ``n_bootstrap`` index arrays. Units are numbered in
    order of first appearance, so one unit per item draws exactly the item bootstrap.
    """
    rng = np.random.default_rng(seed)
    if units is None:
        return rng.integers(0, n, size=(n_bootstrap, n))
    # units numbered in order of first appearance; a missing label (None) is a unit too
    codes, _ = pd.factorize(np.asarray(units, dtype=object), use_na_sentinel=False)
    if codes.shape != (n,):
        raise ValueError(f"units must give one label per item ({n}), got shape {codes.shape}")
    order = np.argsort(codes, kind="stable")  # each unit's items, in input order
    counts = np.bincount(codes)
    starts = np.cumsum(counts) - counts
    out = []
    for picked in rng.integers(0, counts.size, size=(n_bootstrap, counts.size)):
        lens = counts[picked]
        out.append(order[np.repeat(starts[picked] - (np.cumsum(lens) - lens), lens)
                         + np.arange(lens.sum())])
    return out


def percentile_ci(values: ArrayLike, confidence: float = 0.95) -> tuple[float, float]:
    """The percentile interval of bootstrap ``values`` (NaNs dropped; NaN when none is left)."""
    v = _array(values)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(v, [alpha, 1 - alpha])
    return float(lo), float(hi)


def bootstrap_ci(
    x: ArrayLike,
    statistic: Callable[[np.ndarray], np.ndarray] | None = None,
    n_bootstrap: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
    units: ArrayLike | Sequence[Any] | None = None,
) -> tuple[float, float]:
    """Percentile bootstrap CI of ``statistic`` (default: the mean) over the values ``x``,
    resampling items, or whole ``units`` (see :func:`bootstrap_indices`).

    ``statistic`` maps ``[n_bootstrap, n]`` to ``[n_bootstrap]`` (vectorised). NaNs are dropped
    (with their unit labels).
    """
    arr = _array(x)
    labels = None if units is None else np.asarray(units)
    if labels is not None and labels.shape != arr.shape:
        raise ValueError(f"units must give one label per item ({arr.shape}), got "
                         f"shape {labels.shape}")
    keep = ~np.isnan(arr)
    arr = arr[keep]
    if arr.size < 2:
        return float("nan"), float("nan")
    stat = statistic or (lambda a: a.mean(-1))
    idx = bootstrap_indices(arr.size, n_bootstrap, seed, None if labels is None else labels[keep])
    boot = (stat(arr[idx]) if isinstance(idx, np.ndarray)
            else np.array([stat(arr[i][None])[0] for i in idx]))
    return percentile_ci(boot, confidence)


def sign_flip_pvalue(
    x: ArrayLike, n_permutations: int = 9_999, seed: int = 0, exact_max_n: int = 20
) -> float:
    """Two-sided sign-flip p-value for ``mean(x) != 0``: the p-value of
    :func:`tl_reward.stats.paired.sign_flip_test` (exact for ``n <= exact_max_n``, else Monte
    Carlo with ``(1 + count) / (1 + n_permutations)``)."""
    from tl_reward.stats.paired import sign_flip_test

    return sign_flip_test(x, exact_max_n, n_permutations, seed).p_value


MeanSummary = Estimate  # the name summarise_mean's result had


def summarise_mean(x: ArrayLike, n_bootstrap: int = 10_000, confidence: float = 0.95,
                   seed: int = 0, n_permutations: int = 9_999) -> Estimate:
    """The mean of the non-NaN values of ``x`` as an :class:`Estimate`: percentile bootstrap CI
    and two-sided sign-flip p-value (exact up to 20 values, else ``n_permutations`` flips)."""
    arr = _array(x)
    arr = arr[~np.isnan(arr)]
    mean = float(arr.mean()) if arr.size else float("nan")
    lo, hi = bootstrap_ci(arr, n_bootstrap=n_bootstrap, confidence=confidence, seed=seed)
    return Estimate(mean, lo, hi, sign_flip_pvalue(arr, n_permutations, seed), int(arr.size),
                    "mean; percentile bootstrap; sign-flip test", confidence)
