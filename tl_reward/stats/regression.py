"""Ordinary least squares with classical standard errors (what the token analyses fit).

Example:
    >>> fit = ols(y, {"zipf": zipf, "valence": valence})
    >>> fit.table()          # coefficient, SE, t, p, 95 % CI per term
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import special, stats


@dataclass(frozen=True)
class OLSFit:
    """``y = X beta + e`` fitted by least squares (an intercept first).

    Attributes:
        terms: names of the columns of X, ``"intercept"`` first.
        coef, se, t, p: per term; ``p`` two-sided from the t distribution with ``n - k`` dof.
        n: observations; r2: coefficient of determination.
    """

    terms: list[str]
    coef: np.ndarray
    se: np.ndarray
    t: np.ndarray
    p: np.ndarray
    n: int
    r2: float

    def __getitem__(self, term: str) -> float:
        return float(self.coef[self.terms.index(term)])

    def table(self, confidence: float = 0.95) -> pd.DataFrame:
        """Coefficient, standard error, t, p and confidence interval per term."""
        dof = self.n - len(self.terms)
        q = stats.t.ppf(0.5 + confidence / 2, dof) if dof > 0 else np.nan
        return pd.DataFrame({"coef": self.coef, "se": self.se, "t": self.t, "p": self.p,
                             "ci_low": self.coef - q * self.se,
                             "ci_high": self.coef + q * self.se}, index=self.terms)


def ols(y: np.ndarray, predictors: Mapping[str, np.ndarray]) -> OLSFit:
    """Fit ``y`` on an intercept plus ``predictors`` (name -> values)."""
    y = np.asarray(y, dtype=np.float64)
    names = ["intercept", *predictors]
    x = np.column_stack([np.ones_like(y), *[np.asarray(v, dtype=np.float64)
                                             for v in predictors.values()]])
    n, k = x.shape
    if n <= k:
        raise ValueError(f"need more observations ({n}) than coefficients ({k})")
    xtx_inv = np.linalg.pinv(x.T @ x)
    beta = xtx_inv @ x.T @ y
    resid = y - x @ beta
    dof = n - k
    sigma2 = float(resid @ resid) / dof
    se = np.sqrt(np.clip(np.diag(xtx_inv) * sigma2, 0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = beta / se
    p = 2 * special.stdtr(dof, -np.abs(t))
    tss = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float(resid @ resid) / tss if tss > 0 else float("nan")
    return OLSFit(names, beta, se, t, p, n, r2)
