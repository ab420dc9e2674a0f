"""The published reward-lens v1.0.0 "Cohen's d", for comparison only: the probe report shows it
beside the effect size (:mod:`tl_reward.audit.probes`). The published definitions that run a
model are in :mod:`tl_reward.compat.published`, above the audit they reuse."""

from __future__ import annotations

from tl_reward.stats.paired import drop_nan
from tl_reward.stats.ranks import ArrayLike


def published_cohens_d(x: ArrayLike) -> float:
    """``mean / std`` (ddof 0): ``+inf`` for one probe or identical deltas (any sign)."""
    arr = drop_nan(x)
    mean = float(arr.mean())
    std = float(arr.std()) if arr.size > 1 else 0.0
    if std > 1e-8:
        return mean / std
    return float("inf") if abs(mean) > 1e-8 else 0.0
