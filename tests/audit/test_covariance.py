"""Ledoit-Wolf shrinkage against scikit-learn; Mahalanobis fits against a direct computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.covariance import LedoitWolf

from tl_reward.audit.covariance import fit_gaussian, ledoit_wolf
from tl_reward.errors import TLRewardError


@pytest.mark.parametrize("n,d", [(10, 30), (200, 5), (50, 50)])
def test_ledoit_wolf_matches_sklearn(n, d):
    gen = torch.Generator().manual_seed(n + d)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) * torch.linspace(0.1, 3, d) + 2.0
    cov, a = ledoit_wolf(x)
    ref = LedoitWolf().fit(x.numpy())
    assert a == pytest.approx(ref.shrinkage_, abs=1e-12)
    # float64 throughout: agreement to rounding
    np.testing.assert_allclose(cov.numpy(), ref.covariance_, atol=1e-12, rtol=0)


def test_fit_gaussian_distances():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 8, generator=gen, dtype=torch.float64) * torch.arange(1, 9)
    fit = fit_gaussian(x)
    cov = LedoitWolf().fit(x.numpy()).covariance_
    q = torch.randn(5, 8, generator=gen, dtype=torch.float64)
    diff = (q - x.mean(0)).numpy()
    ref = np.sqrt(np.einsum("nd,de,ne->n", diff, np.linalg.inv(cov), diff))
    np.testing.assert_allclose(fit.distance(q).numpy(), ref, rtol=1e-10)
    # PCA subspace: k < n directions, each of unit variance on the fitted data
    pca = fit_gaussian(x, "pca", k=3)
    z = (x - x.mean(0)) @ pca.whitener.T
    np.testing.assert_allclose(z.var(0, unbiased=True).numpy(), np.ones(3), rtol=1e-10)
    with pytest.raises(TLRewardError, match="k < n"):
        fit_gaussian(x, "pca", k=40)
