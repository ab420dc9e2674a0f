"""Tuned reward lens: one affine map per layer, trained to predict the final reward.

The plain lens reads layer ``l`` through the final head, which assumes the residual basis does
not drift. The tuned lens learns, per layer, an affine map of the (freshly normed) residual at
the pooled token to the model's final reward. For a scalar target an affine translator followed
by the fixed head is itself an affine readout, so we fit ``r_hat_l = a_l . N(h_l) + c_l``
directly: ridge regression (penalty chosen by leave-one-out on the training split), and report
held-out R^2 per layer beside the R^2 of the untrained lens in both conventions.

Example:
    >>> tuned = tuned_reward_lens(model, texts, test_fraction=0.25)
    >>> tuned.to_dataframe()          # layer, R^2 tuned / frozen / recompute (held out)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.analysis.lens import lens_from_residuals, pooled_residuals
from tl_reward.errors import TLRewardError
from tl_reward.model.heads import objective_slot
from tl_reward.model.readout import ObjectiveSpec, normalise
from tl_reward.results import ShortRepr

ALPHAS = tuple(float(a) for a in np.logspace(-3, 4, 15))


def r2_score(pred: np.ndarray, target: np.ndarray) -> float:
    """Coefficient of determination of ``pred`` for ``target`` (1 - SSE / SST)."""
    sst = float(((target - target.mean()) ** 2).sum())
    return float("nan") if sst == 0 else 1.0 - float(((target - pred) ** 2).sum()) / sst


@dataclass(repr=False)
class TunedRewardLens(ShortRepr):
    """Per-layer affine readouts of the final reward.

    Attributes:
        weight: ``[L + 1, n_obj, d_model]``, ``intercept``: ``[L + 1, n_obj]``, ``alpha``:
            ``[L + 1, n_obj]`` chosen ridge penalties.
        r2_test, r2_train: ``[L + 1, n_obj]`` R^2 of the tuned lens on held-out / training
            inputs; ``r2_frozen``, ``r2_recompute``: held-out R^2 of the untrained lens.
        objectives, layer_names: labels; ``n_train``, ``n_test``: split sizes.
    """

    weight: Float[torch.Tensor, "layer1 n_obj d_model"]
    intercept: Float[torch.Tensor, "layer1 n_obj"]
    alpha: Float[torch.Tensor, "layer1 n_obj"]
    r2_test: Float[torch.Tensor, "layer1 n_obj"]
    r2_train: Float[torch.Tensor, "layer1 n_obj"]
    r2_frozen: Float[torch.Tensor, "layer1 n_obj"]
    r2_recompute: Float[torch.Tensor, "layer1 n_obj"]
    objectives: list[str]
    layer_names: list[str]
    n_train: int
    n_test: int

    def predict(self, model: Any, inputs: Any, batch_size: int = 8
                ) -> Float[torch.Tensor, "n layer1 n_obj"]:
        """Tuned-lens predictions for new inputs."""
        pooled = pooled_residuals(model, inputs, self.objectives, batch_size)
        x = normalise(model, pooled.resid)
        return torch.einsum("nld,lkd->nlk", x, self.weight) + self.intercept

    def to_dataframe(self) -> pd.DataFrame:
        """One row per layer and objective: held-out R^2 of the tuned and untrained lenses."""
        rows = [(obj, li, name, float(self.r2_test[li, k]), float(self.r2_train[li, k]),
                 float(self.r2_frozen[li, k]), float(self.r2_recompute[li, k]),
                 float(self.alpha[li, k]))
                for k, obj in enumerate(self.objectives)
                for li, name in enumerate(self.layer_names)]
        return pd.DataFrame(rows, columns=["objective", "layer", "layer_name", "r2_tuned",
                                           "r2_tuned_train", "r2_frozen", "r2_recompute",
                                           "alpha"])

    def plot(self, objective: int | str = 0) -> Any:
        """Held-out R^2 per layer: tuned against untrained lenses."""
        from tl_reward.viz.lens import r2_figure

        k = objective_slot(self.objectives, objective)
        return r2_figure({"tuned": self.r2_test[:, k], "frozen": self.r2_frozen[:, k],
                          "recompute": self.r2_recompute[:, k]}, self.layer_names,
                         title=f"Tuned reward lens, held-out R^2 ({self.objectives[k]}, "
                               f"n_test={self.n_test})")


def tuned_reward_lens(
    model: Any,
    inputs: Any,
    objectives: ObjectiveSpec = None,
    test_fraction: float = 0.25,
    seed: int = 0,
    alphas: tuple[float, ...] = ALPHAS,
    batch_size: int = 8,
    progress: bool | None = None,
) -> TunedRewardLens:
    """Fit a tuned reward lens on a random ``1 - test_fraction`` of ``inputs``; report R^2 on
    the rest."""
    from sklearn.linear_model import RidgeCV

    pooled = pooled_residuals(model, inputs, objectives, batch_size, progress)
    n = pooled.resid.shape[0]
    n_test = int(round(n * test_fraction))
    if n_test < 2 or n - n_test < 3:
        raise TLRewardError(f"{n} inputs are too few for a tuned lens with test_fraction="
                            f"{test_fraction}; pass at least ~12 inputs")
    perm = np.random.default_rng(seed).permutation(n)
    test, train = perm[:n_test], perm[n_test:]
    x = normalise(model, pooled.resid).double().numpy()
    y = pooled.reward.double().numpy()
    plain = lens_from_residuals(model, pooled)
    n_l, n_k, d = x.shape[1], y.shape[1], x.shape[2]
    weight, intercept, alpha = np.zeros((n_l, n_k, d)), np.zeros((n_l, n_k)), np.zeros((n_l, n_k))
    r2 = {key: np.zeros((n_l, n_k)) for key in ("test", "train", "frozen", "recompute")}
    for li in range(n_l):
        for k in range(n_k):
            fit = RidgeCV(alphas=alphas).fit(x[train, li], y[train, k])
            weight[li, k], intercept[li, k], alpha[li, k] = fit.coef_, fit.intercept_, fit.alpha_
            r2["test"][li, k] = r2_score(fit.predict(x[test, li]), y[test, k])
            r2["train"][li, k] = r2_score(fit.predict(x[train, li]), y[train, k])
            for conv in ("frozen", "recompute"):
                r2[conv][li, k] = r2_score(plain.values[conv][test, li, k].double().numpy(),
                                           y[test, k])
    fits = {"weight": weight, "intercept": intercept, "alpha": alpha, **r2}  # field order
    return TunedRewardLens(*(torch.tensor(v, dtype=torch.float32) for v in fits.values()),
                           pooled.objectives, plain.layer_names, len(train), len(test))
