"""The natural distribution of an activation: shrinkage covariance and Mahalanobis distances.

With ``n`` samples of a ``d``-dimensional activation and ``n`` not much larger than ``d`` (often
smaller), the sample covariance is singular or badly conditioned, and a pseudo-inverse makes
distances meaningless. Two well-posed choices:

* ``ledoit_wolf``: ``(1 - a) S + a mu I`` with ``mu = tr(S) / d`` and the shrinkage ``a`` that
  minimises the expected Frobenius loss (Ledoit & Wolf 2004; the estimator of
  ``sklearn.covariance.LedoitWolf``, computed here in float64 on the activations' device);
* ``pca``: the top ``k < n`` principal directions; the distance is measured in that subspace.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float

from tl_reward.errors import TLRewardError
from tl_reward.results import ShortRepr


def ledoit_wolf(
    x: Float[torch.Tensor, "n d"],
) -> tuple[Float[torch.Tensor, "d d"], float]:
    """Ledoit-Wolf shrinkage covariance of the rows of ``x`` (centred on their mean) and the
    shrinkage ``a`` in [0, 1]; float64."""
    x = x.double()
    n, d = x.shape
    if n < 2:
        raise TLRewardError("a covariance needs at least 2 samples")
    xc = x - x.mean(0)
    s = xc.T @ xc / n
    mu = torch.diagonal(s).sum() / d
    x2 = xc**2
    beta_ = (x2.T @ x2).sum()
    delta_ = (s**2).sum()
    beta = (beta_ / n - delta_) / (d * n)
    delta = (delta_ - 2 * mu * torch.diagonal(s).sum() + d * mu**2) / d
    beta = torch.minimum(beta, delta)
    a = 0.0 if float(beta) == 0 else float(beta / delta)
    shrunk = (1 - a) * s
    shrunk.diagonal().add_(a * mu)
    return shrunk, a


@dataclass(repr=False)
class GaussianFit(ShortRepr):
    """Mean and whitening map of a site's natural activations.

    ``distance(x) = |W (x - mean)|``: with ``method="ledoit_wolf"`` ``W`` is the inverse Cholesky
    factor of the shrunk covariance (the Mahalanobis distance); with ``"pca"`` it projects onto
    the top ``k`` principal directions divided by their standard deviations.
    """

    mean: Float[torch.Tensor, " d"]
    whitener: Float[torch.Tensor, "k d"]
    method: str
    n: int
    shrinkage: float | None = None

    def distance(self, x: Float[torch.Tensor, "... d"]) -> Float[torch.Tensor, "..."]:
        """Mahalanobis distance of each row (float64, on the fit's device)."""
        z = (x.to(self.mean.device).double() - self.mean) @ self.whitener.T
        return z.norm(dim=-1)


def fit_gaussian(x: Float[torch.Tensor, "n d"], method: str = "ledoit_wolf",
                 k: int | None = None) -> GaussianFit:
    """Fit mean and shrinkage (or PCA-subspace) covariance of the rows of ``x``."""
    x = x.double()
    n, d = x.shape
    mean = x.mean(0)
    if method == "ledoit_wolf":
        cov, a = ledoit_wolf(x)
        chol = torch.linalg.cholesky(cov)
        whitener = torch.linalg.solve_triangular(chol, torch.eye(d, dtype=x.dtype,
                                                                 device=x.device), upper=False)
        return GaussianFit(mean, whitener, method, n, a)
    if method == "pca":
        k = min(n - 1, d) // 2 if k is None else k
        if not 0 < k < n:
            raise TLRewardError(f"PCA needs 0 < k < n (n = {n} samples), got k = {k}")
        xc = x - mean
        _, sv, vt = torch.linalg.svd(xc, full_matrices=False)
        sd = sv[:k] / (n - 1) ** 0.5
        if float(sd[-1]) <= 0:
            raise TLRewardError(f"the activations span fewer than k = {k} dimensions")
        return GaussianFit(mean, vt[:k] / sd[:, None], method, n)
    raise TLRewardError(f"unknown method {method!r}; choose 'ledoit_wolf' or 'pca'")
