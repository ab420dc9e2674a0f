"""Resampling statistics: the one bootstrap (items or whole units) with its percentile
interval, and the Spearman rank correlation the faithfulness report averages. A mean's interval
is not a bootstrap one: it inverts the sign-flip test (:mod:`tl_reward.stats.paired`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.stats.ranks import ArrayLike, as_array, average_ranks


def pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r along the last axis (NaN where either side is constant)."""
    xc, yc = x - x.mean(-1, keepdims=True), y - y.mean(-1, keepdims=True)
    den = np.sqrt((xc**2).sum(-1) * (yc**2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (xc * yc).sum(-1) / den, np.nan)


def spearman(a: Float[torch.Tensor, "... n"], b: Float[torch.Tensor, "... n"]
             ) -> Float[torch.Tensor, "..."]:
    """Spearman's rho along the last axis (NaN where either side is constant), float64; ranks
    from :func:`~tl_reward.stats.ranks.average_ranks` (O(n log n), O(n) memory per row)."""
    return torch.as_tensor(pearson_rows(average_ranks(a), average_ranks(b)),
                           dtype=torch.float64, device=a.device)


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


def percentile_ci(values: ArrayLike, confidence: float = 0.95, min_valid: int = 1
                  ) -> tuple[float, float]:
    """The percentile interval of bootstrap ``values`` (NaNs dropped; NaN when fewer than
    ``min_valid`` are left)."""
    v = as_array(values)
    v = v[~np.isnan(v)]
    if v.size < max(min_valid, 1):
        return float("nan"), float("nan")
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(v, [alpha, 1 - alpha])
    return float(lo), float(hi)
