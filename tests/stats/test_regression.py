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
