"""Ordinary least squares with classical standard errors (what the token analyses fit).

Example:
    >>> fit = ols(y, {"zipf": zipf, "valence": valence})
    >>> fit.table()          # coefficient, SE, t, p, 95 % CI per term
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import special, stats

from tl_reward.results import result_type


@result_type
@dataclass(frozen=True)
class OLSFit:
    """``y = X beta + e`` fitted by least squares (an intercept first).

    Attributes:
        terms: names of the columns of X, ``"intercept"`` first.
        coef, se, t, p: per term; ``p`` two-sided from the t distribution with ``n - k`` dof.
        n: observations; r2: coefficient of determination; rank: rank of X (dof ``n - rank``).
    """

    terms: list[str]
    coef: np.ndarray
    se: np.ndarray
    t: np.ndarray
    p: np.ndarray
    n: int
    r2: float
    rank: int

    def __getitem__(self, term: str) -> float:
        return float(self.coef[self.terms.index(term)])

    def table(self, confidence: float = 0.95) -> pd.DataFrame:
        """Coefficient, standard error, t, p and confidence interval per term."""
        dof = self.n - self.rank
        q = stats.t.ppf(0.5 + confidence / 2, dof) if dof > 0 else np.nan
        return pd.DataFrame({"coef": self.coef, "se": self.se, "t": self.t, "p": self.p,
                             "ci_low": self.coef - q * self.se,
                             "ci_high": self.coef + q * self.se}, index=self.terms)


def ols(y: np.ndarray, predictors: Mapping[str, np.ndarray]) -> OLSFit:
    """Fit ``y`` on an intercept plus ``predictors`` (name -> values).

    A rank-deficient design (collinear predictors) warns, and every coefficient that the data
    cannot identify (``e_j`` outside the row space of X: the null space of X has a non-zero
    ``j``-th entry) gets NaN for coef, se, t and p; the identified ones and the residual dof
    (``n - rank``) are those of the fit on a full-rank subset of the columns.
    """
    y = np.asarray(y, dtype=np.float64)
    names = ["intercept", *predictors]
    x = np.column_stack([np.ones_like(y), *[np.asarray(v, dtype=np.float64)
                                             for v in predictors.values()]])
    n, k = x.shape
    if n <= k:
        raise ValueError(f"need more observations ({n}) than coefficients ({k})")
    _, sv, vt = np.linalg.svd(x, full_matrices=True)
    tol = sv.max() * max(n, k) * np.finfo(np.float64).eps  # numpy matrix_rank's default
    rank = int((sv > tol).sum())
    unidentified = np.zeros(k, dtype=bool)
    if rank < k:
        unidentified = np.abs(vt[rank:]).max(axis=0) > 1e-8
        warnings.warn(f"collinear predictors: design rank {rank} < {k} coefficients; "
                      f"{np.array(names)[unidentified].tolist()} are not identified "
                      "(NaN)", RuntimeWarning, stacklevel=2)
    xtx_inv = np.linalg.pinv(x.T @ x)
    beta = xtx_inv @ x.T @ y
    resid = y - x @ beta
    dof = n - rank
    sigma2 = float(resid @ resid) / dof
    se = np.sqrt(np.clip(np.diag(xtx_inv) * sigma2, 0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = beta / se
    p = 2 * special.stdtr(dof, -np.abs(t))
    for arr in (beta, se, t, p):
        arr[unidentified] = np.nan
    tss = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float(resid @ resid) / tss if tss > 0 else float("nan")
    return OLSFit(names, beta, se, t, p, n, r2, rank)
