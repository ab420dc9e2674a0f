"""Multiplicity: many tests read as one verdict.

:func:`benjamini_hochberg` adjusts a family of tests for its false discovery rate (the audit's
probes, cascade links and term conflicts). A monitor that tests every step of a run (and every
component of a reward model) at level ``alpha`` raises a false alarm on most null runs of any
length; :func:`holm` rejects with a family-wise error rate of ``alpha`` over all the tests
instead (Holm's step-down), valid under any dependence between them.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from tl_reward.errors import TLRewardError
from tl_reward.stats.ranks import ArrayLike, as_array

__all__ = ["benjamini_hochberg", "holm"]


def benjamini_hochberg(p_values: ArrayLike) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (``scipy.stats.false_discovery_control``); NaNs kept
    as NaN and not counted among the hypotheses."""
    p = as_array(p_values).ravel()
    out = np.full(p.shape, np.nan)
    if (ok := ~np.isnan(p)).any():
        out[ok] = stats.false_discovery_control(p[ok])
    return out


def holm(p_values: np.ndarray, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """``(rejected, adjusted)``, both of ``p_values``' shape: Holm's step-down over its finite
    entries, one family; a NaN p-value (a test that could not be made) is left out of the
    family, never rejected, and its adjusted value is NaN.

    The same numbers as ``statsmodels.stats.multitest.multipletests(method="holm")`` (the tests
    check it), which runs ``gc.collect()`` on every call (50 to 200 ms in a process holding a
    model; a simulation calls it thousands of times)."""
    if not 0 < alpha < 1:
        raise TLRewardError(f"alpha must lie in (0, 1), got {alpha}")
    p = np.asarray(p_values, dtype=np.float64)
    rejected, adjusted = np.zeros(p.shape, dtype=bool), np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    if len(ok):
        order = ok[np.argsort(p.flat[ok], kind="stable")]
        m = len(order)
        adj = np.minimum(np.maximum.accumulate(p.flat[order] * np.arange(m, 0, -1)), 1.0)
        adjusted.flat[order] = adj
        rejected.flat[order] = np.cumprod(p.flat[order] <= alpha / np.arange(m, 0, -1)) > 0
    return rejected, adjusted
