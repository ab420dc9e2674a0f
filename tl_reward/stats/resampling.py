"""Resampling statistics: the one bootstrap (items or whole units), the jackknife Fisher-z
interval of a correlation, and the Spearman rank correlation the faithfulness report averages.
A mean's interval inverts the sign-flip test (:mod:`tl_reward.stats.paired`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from scipy import stats

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


#: Smallest number of units for which :func:`fisher_interval` gives an interval.
FISHER_MIN_N = 10


def leave_one_out(n: int) -> np.ndarray:
    """``[n, n - 1]``: row ``i`` indexes every item but ``i``."""
    j = np.arange(n - 1)
    return j[None] + (j[None] >= np.arange(n)[:, None])


def fisher_interval(value: float, jackknife: ArrayLike, floor_se: float,
                    confidence: float = 0.95) -> tuple[float, float, str]:
    """``(low, high, reason)``: the interval of a correlation-like ``value`` in ``(-1, 1)`` on
    the Fisher-z scale, ``tanh(atanh(value) +- t_{n-1} se)``, with ``se`` the jackknife standard
    error of ``atanh`` over the ``n`` leave-one-out ``jackknife`` values, but at least
    ``floor_se`` (the normal-theory se: the jackknife's own is too noisy at small n). Simulated
    coverage (``tests/stats/test_fisher_interval.py``) at least 0.93 of nominal 0.95 from
    ``FISHER_MIN_N`` units, normal and skewed data; NaN below that, at ``|value| = 1`` or when a
    leave-one-out value is undefined (``reason`` says why, else ``""``)."""
    with np.errstate(divide="ignore"):
        z = np.arctanh(np.clip(as_array(jackknife), -1.0, 1.0))
    n = z.size
    if n < FISHER_MIN_N:
        return np.nan, np.nan, f"no interval below {FISHER_MIN_N} units (got {n})"
    if not (abs(value) < 1 and np.isfinite(z).all()):
        return np.nan, np.nan, "no interval at |r| = 1 or with an undefined leave-one-out r"
    se = max(float(np.sqrt((n - 1) / n * ((z - z.mean()) ** 2).sum())), floor_se)
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * se
    return float(np.tanh(np.arctanh(value) - half)), float(np.tanh(np.arctanh(value) + half)), ""
