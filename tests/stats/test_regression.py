"""OLS against statsmodels (an independent implementation)."""

from __future__ import annotations

import numpy as np
import pytest

from tl_reward.stats.regression import ols


def test_ols_matches_statsmodels() -> None:
    import statsmodels.api as sm
    rng = np.random.default_rng(0)
    x1, x2 = rng.normal(size=200), rng.normal(size=200)
    y = 0.5 + 2.0 * x1 - 1.0 * x2 + rng.normal(size=200)
    fit = ols(y, {"x1": x1, "x2": x2})
    ref = sm.OLS(y, sm.add_constant(np.column_stack([x1, x2]))).fit()
    np.testing.assert_allclose(fit.coef, ref.params, rtol=1e-10)
    np.testing.assert_allclose(fit.se, ref.bse, rtol=1e-10)
    np.testing.assert_allclose(fit.p, ref.pvalues, rtol=1e-8)
    assert fit.r2 == pytest.approx(ref.rsquared)
    table = fit.table()
    np.testing.assert_allclose(table[["ci_low", "ci_high"]].to_numpy(), ref.conf_int(), rtol=1e-10)
    assert fit["x1"] == pytest.approx(ref.params[1])


def test_ols_needs_enough_observations() -> None:
    with pytest.raises(ValueError, match="more observations"):
        ols(np.ones(2), {"x": np.ones(2)})


def test_ols_collinear_predictors_warn_and_leave_unidentified_coefficients_nan() -> None:
    # x2 = 2 x1: only x1 + 2 x2 is identified; on main x1, x2 got t = 20.4, p ~ 0 silently.
    # Reference: statsmodels on the full-rank design [1, x1, x3] (same fitted values, dof n - 3)
    import statsmodels.api as sm
    rng = np.random.default_rng(0)
    x1, x3 = rng.normal(size=60), rng.normal(size=60)
    y = 1.0 + 3.0 * x1 + 0.5 * x3 + rng.normal(size=60)
    with pytest.warns(RuntimeWarning, match="rank 3 < 4"):
        fit = ols(y, {"x1": x1, "x2": 2 * x1, "x3": x3})
    ref = sm.OLS(y, sm.add_constant(np.column_stack([x1, x3]))).fit()
    assert fit.rank == 3
    for arr in (fit.coef, fit.se, fit.t, fit.p):
        assert np.isnan(arr[1:3]).all()
    keep = [0, 3]
    np.testing.assert_allclose(fit.coef[keep], ref.params[[0, 2]], rtol=1e-9)
    np.testing.assert_allclose(fit.se[keep], ref.bse[[0, 2]], rtol=1e-9)
    np.testing.assert_allclose(fit.p[keep], ref.pvalues[[0, 2]], rtol=1e-7)
    np.testing.assert_allclose(fit.table().loc["x3", ["ci_low", "ci_high"]].to_numpy(),
                               ref.conf_int()[2], rtol=1e-9)
