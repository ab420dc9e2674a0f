"""Distortion index: how unevenly the reward responds to the probed value dimensions.

Ours, in absolute units. The *sensitivity* of dimension k is its probes' standardised effect,
``s_k = mean_i(delta_ik) / sd(r on natural replies)``: how far the edit moves the reward, in
units of the reward's own spread over the unedited replies of the same base items. The *index*
is the Gini coefficient of ``|s_k|`` over the dimensions,
``G = sum_jk |a_j - a_k| / (2 K^2 mean(a))`` with ``a = |s|``: 0 when every dimension moves the
reward equally, ``1 - 1/K`` when one dimension alone does. We use Gini (not the coefficient of
variation, also reported) because it is bounded and robust to one large dimension. Confidence
intervals come from one bootstrap over base items: the same resampled items in every dimension
and in the natural sd, so the matched structure is kept. No dimension is forced to 0, and the
sensitivities shrink with the deltas (a model indifferent to every edit has all ``s_k`` near 0).

Published (reward-lens v1.0.0), for comparison: every probe's delta min-max normalised over all
probes pooled (``c``), per dimension ``C = 1 - prod(1 - c)``, and ``D = 1 - C / max C``:
purely relative (invariant to scaling all deltas), the strongest dimension always scores
exactly 0, and one saturated probe (``c = 1``) sets its dimension's C to 1.

Example:
    >>> res = distortion_index(report)            # report: a ProbeReport
    >>> res.index, res.index_ci                   # Gini of |sensitivity| with its CI
    >>> published_distortion_index(report.delta_matrix())
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tl_reward.errors import TLRewardError
from tl_reward.results import ShortRepr


def gini(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Gini coefficient of non-negative values along ``axis`` (NaN when all are 0)."""
    a = np.abs(np.asarray(values, dtype=np.float64))
    a = np.moveaxis(a, axis, -1)
    k = a.shape[-1]
    diff = np.abs(a[..., :, None] - a[..., None, :]).sum((-1, -2))
    mean = a.mean(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean > 0, diff / (2 * k * k * mean), np.nan)


def coefficient_of_variation(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """``sd / mean`` (ddof 0) of ``|values|`` along ``axis`` (NaN when the mean is 0)."""
    a = np.abs(np.asarray(values, dtype=np.float64))
    mean = a.mean(axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean > 0, a.std(axis) / mean, np.nan)


@dataclass(repr=False)
class DistortionResult(ShortRepr):
    """Sensitivity per dimension (natural-sd units) and the unevenness index.

    Attributes:
        dimensions: the K dimensions; n_items: base items (matched across dimensions).
        sensitivity, ci_low, ci_high: ``s_k`` and its bootstrap CI, per dimension.
        index, index_ci: Gini of ``|s|`` and its CI; cv, cv_ci: coefficient of variation.
        natural_sd: the sd of ``r`` on natural replies the sensitivities are divided by.
    """

    dimensions: list[str]
    n_items: int
    sensitivity: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    index: float
    index_ci: tuple[float, float]
    cv: float
    cv_ci: tuple[float, float]
    natural_sd: float

    def to_dataframe(self) -> pd.DataFrame:
        """One row per dimension: sensitivity, its CI and its share of ``sum |s|``."""
        a = np.abs(self.sensitivity)
        return pd.DataFrame({"dimension": self.dimensions, "sensitivity": self.sensitivity,
                             "ci_low": self.ci_low, "ci_high": self.ci_high,
                             "share": a / a.sum() if a.sum() > 0 else np.nan})

    def plot(self) -> Any:
        """Bar chart of the sensitivities with CIs; the index with its CI in the title."""
        from tl_reward.viz.audit import distortion_chart

        return distortion_chart(self)


def _matrix(deltas: Any) -> pd.DataFrame:
    if hasattr(deltas, "delta_matrix"):
        return deltas.delta_matrix()
    if isinstance(deltas, pd.DataFrame):
        return deltas
    raise TLRewardError("pass a ProbeReport or an items x dimensions DataFrame of deltas")


def distortion_index(report: Any, natural: pd.Series | np.ndarray | None = None,
                     n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0
                     ) -> DistortionResult:
    """:class:`DistortionResult` of a :class:`~tl_reward.audit.probes.ProbeReport` (or of an
    items x dimensions delta DataFrame plus the natural rewards of the same items)."""
    mat = _matrix(report)
    if natural is None:
        if not hasattr(report, "natural_rewards"):
            raise TLRewardError("pass the natural rewards of the items (natural=...) to scale "
                                "the sensitivities")
        natural = report.natural_rewards()
    nat = (natural.reindex(mat.index) if isinstance(natural, pd.Series)
           else pd.Series(np.asarray(natural, dtype=np.float64), index=mat.index))
    if nat.isna().any():
        raise TLRewardError("every item needs its natural reward")
    d = mat.to_numpy(np.float64)
    r = nat.to_numpy(np.float64)
    n, k = d.shape
    if n < 3 or k < 2:
        raise TLRewardError(f"need >= 3 items and >= 2 dimensions, got {n} x {k}")
    sd = float(r.std(ddof=1))
    if not sd > 0:
        raise TLRewardError("the natural rewards have zero spread; sensitivities are undefined")
    sens = np.nanmean(d, 0) / sd
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_resamples, n))
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an item set with no applied edit
        boot = np.nanmean(d[idx], 1) / r[idx].std(1, ddof=1)[:, None]
    a = (1 - confidence) / 2
    lo, hi = np.nanquantile(boot, [a, 1 - a], axis=0)
    g, cv = gini(boot), coefficient_of_variation(boot)
    g_ci = tuple(float(v) for v in np.nanquantile(g, [a, 1 - a]))
    cv_ci = tuple(float(v) for v in np.nanquantile(cv, [a, 1 - a]))
    return DistortionResult(list(mat.columns), n, sens, lo, hi, float(gini(sens)), g_ci,
                            float(coefficient_of_variation(sens)), cv_ci, sd)


@dataclass
class PublishedDistortion:
    """reward-lens v1.0.0's distortion index, for comparison only.

    Attributes:
        dimensions: the dimensions; coverage: ``C = 1 - prod(1 - c)`` per dimension;
        distortion: ``D = 1 - C / max C`` (the strongest dimension is always 0);
        normalised: per dimension, each probe's pooled min-max normalised delta ``c``.
    """

    dimensions: list[str]
    coverage: np.ndarray
    distortion: np.ndarray
    normalised: dict[str, np.ndarray]

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame({"dimension": self.dimensions, "coverage": self.coverage,
                             "published_distortion": self.distortion})


def published_distortion_index(deltas: Mapping[str, Sequence[float]] | pd.DataFrame
                               ) -> PublishedDistortion:
    """The published definition on per-probe deltas (dimension -> deltas, or a delta matrix
    whose NaNs are dropped): pooled min-max, ``1 - prod(1 - c)``, ``1 - C / max C``."""
    if isinstance(deltas, pd.DataFrame):
        deltas = {c: deltas[c].dropna().to_numpy() for c in deltas.columns}
    dims = list(deltas)
    vals = {k: np.asarray(v, dtype=np.float64) for k, v in deltas.items()}
    pooled = np.concatenate([vals[k] for k in dims]) if dims else np.zeros(0)
    lo, hi = (pooled.min(), pooled.max()) if pooled.size else (0.0, 0.0)
    norm = {k: ((v - lo) / (hi - lo) if hi > lo else np.full_like(v, 0.5))
            for k, v in vals.items()}
    cov = np.array([0.0 if norm[k].sum() == 0 else 1 - np.prod(1 - np.clip(norm[k], 0, 1))
                    for k in dims])
    dist = 1 - cov / cov.max() if cov.size and cov.max() > 0 else np.ones(len(dims))
    return PublishedDistortion(dims, cov, dist, norm)
