"""Multiplicity: many tests read as one verdict.

A monitor that tests every step of a run (and every component of a reward model) at level
``alpha`` raises a false alarm on most null runs of any length; :func:`holm` rejects with a
family-wise error rate of ``alpha`` over all the tests instead (Holm's step-down,
``statsmodels.stats.multitest.multipletests``), valid under any dependence between them.
"""

from __future__ import annotations

import numpy as np

from tl_reward.errors import TLRewardError

__all__ = ["holm"]


def holm(p_values: np.ndarray, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """``(rejected, adjusted)``, both of ``p_values``' shape: Holm's step-down over its finite
    entries, one family; a NaN p-value (a test that could not be made) is left out of the
    family, never rejected, and its adjusted value is NaN."""
    from statsmodels.stats.multitest import multipletests

    if not 0 < alpha < 1:
        raise TLRewardError(f"alpha must lie in (0, 1), got {alpha}")
    p = np.asarray(p_values, dtype=np.float64)
    rejected, adjusted = np.zeros(p.shape, dtype=bool), np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        rej, adj, _, _ = multipletests(p[ok], alpha=alpha, method="holm")
        rejected[ok], adjusted[ok] = rej, adj
    return rejected, adjusted
