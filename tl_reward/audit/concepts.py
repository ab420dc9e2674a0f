"""Concept vectors: where a concept lives in the residual stream and how the reward reads it.

A concept is given by positive and negative inputs (e.g. polite vs rude replies). Its vector
at layer ``l`` is the difference of means of the residual at the pooled token ``t*``:
``v = mean(h_pos) - mean(h_neg)``; its *spread* is the pooled within-class standard deviation of
the inputs' coordinate along ``u = v / |v|`` (ddof 1), the unit steering strengths are given in.

Alignment with the reward is measured where the head acts. The objective reads
``r = w . N(h_L) + b`` (``w``: the ``W_U`` column with the final norm's gain folded in, or
``w_eff(x)`` for a gated head, centred for LayerNorm); at input x the reward's local direction in
the final residual is the gradient ``g(x) = d r / d h_L`` at ``t*``, which for RMSNorm is
``w / s - (w . h) h / (d s^3)``: the frozen-scale direction ``w / s`` plus the norm's response.
We report

* ``cosine_head``: cosine of ``v`` with ``w`` (the head's direction in residual coordinates,
  scale frozen; per input for gated heads);
* ``cosine_local``: cosine of ``v`` with ``g(x)``, per input;
* ``slope``: ``spread * g(x) . u``, the first-order reward change per unit of the concept's
  spread added at ``t*`` (exact as the step shrinks when the concept is at the final layer; for
  an earlier layer it is the direct path only, and the steering curve gives the total effect);
* ``separability``: held-out (cross-validated) accuracy of a logistic-regression probe on the
  activations, with its exact binomial interval over items.

The published definition, for comparison: :mod:`tl_reward.compat.published`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.audit.pooled import pooled_residual, resid_hook, residual_batches
from tl_reward.errors import TLRewardError
from tl_reward.model.inputs import encode_inputs
from tl_reward.model.readout import is_layernorm, normalise, resolve_objectives
from tl_reward.results import ShortRepr, result_type
from tl_reward.stats.paired import share_interval, sign_flip_test


@dataclass(repr=False)
class ConceptVector(ShortRepr):
    """A difference-of-means concept direction at one layer.

    Attributes:
        name: the concept's label.
        layer: residual layer (``n_layers`` = final residual).
        vector: ``mean(h_pos) - mean(h_neg)`` at ``t*``, ``[d_model]`` float32.
        spread: pooled within-class sd of the coordinate along ``vector / |vector|`` (ddof 1).
        h_pos, h_neg: the activations it was built from (kept for the separability probe).
    """

    name: str
    layer: int
    vector: Float[torch.Tensor, " d_model"]
    spread: float
    h_pos: Float[torch.Tensor, "n_pos d_model"]
    h_neg: Float[torch.Tensor, "n_neg d_model"]

    @property
    def unit(self) -> Float[torch.Tensor, " d_model"]:
        """``vector / |vector|``."""
        return self.vector / self.vector.norm()


def concept_from_activations(name: str, layer: int, h_pos: torch.Tensor,
                             h_neg: torch.Tensor) -> ConceptVector:
    """A :class:`ConceptVector` from activations already pooled at ``t*``."""
    if len(h_pos) < 2 or len(h_neg) < 2:
        raise TLRewardError("a concept needs at least 2 positive and 2 negative inputs (the "
                            "spread is a standard deviation)")
    h_pos, h_neg = h_pos.float(), h_neg.float()
    v = h_pos.mean(0) - h_neg.mean(0)
    if float(v.norm()) == 0.0:
        raise TLRewardError(f"concept {name!r}: positive and negative means coincide")
    u = v / v.norm()
    cp, cn = h_pos @ u, h_neg @ u
    pooled_var = (((cp - cp.mean()) ** 2).sum() + ((cn - cn.mean()) ** 2).sum()) / (
        len(cp) + len(cn) - 2)
    spread = float(pooled_var.sqrt())
    if spread == 0.0:
        raise TLRewardError(f"concept {name!r} has zero spread along its direction")
    return ConceptVector(name, layer, v, spread, h_pos, h_neg)


def concept_vector(
    model: Any, positive: Sequence[Any], negative: Sequence[Any], layer: int | None = None,
    name: str = "concept", batch_size: int = 8,
) -> ConceptVector:
    """Difference of means at ``t*`` at ``layer`` (default: the final residual)."""
    layer = model.cfg.n_layers if layer is None else layer
    h_pos = pooled_residual(model, positive, layer, batch_size)
    h_neg = pooled_residual(model, negative, layer, batch_size)
    return concept_from_activations(name, layer, h_pos, h_neg)


@result_type
@dataclass
class Separability:
    """Cross-validated accuracy of a linear probe separating the concept's two classes."""

    accuracy: float
    ci_low: float
    ci_high: float
    n: int
    folds: int
    chance: float

    def __str__(self) -> str:
        return (f"{self.accuracy:.3f} [{self.ci_low:.3f}, {self.ci_high:.3f}] "
                f"(n = {self.n}, {self.folds}-fold, chance {self.chance:.3f})")


def concept_separability(concept: ConceptVector, folds: int = 5, c: float = 1.0,
                         seed: int = 0) -> Separability:
    """Out-of-fold accuracy of a standardised logistic-regression probe (scikit-learn,
    stratified ``folds``-fold CV; every item is predicted by a probe that never saw it) with its
    exact binomial interval (:func:`~tl_reward.stats.paired.share_interval`)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = torch.cat([concept.h_pos, concept.h_neg]).double().cpu().numpy()
    y = np.r_[np.ones(len(concept.h_pos)), np.zeros(len(concept.h_neg))]
    k = min(folds, len(concept.h_pos), len(concept.h_neg))
    if k < 2:
        raise TLRewardError("separability needs at least 2 inputs per class")
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000))
    pred = cross_val_predict(probe, x, y, cv=StratifiedKFold(k, shuffle=True, random_state=seed))
    correct = (pred == y).astype(np.float64)
    lo, hi = share_interval(int(correct.sum()), 0, correct.size)
    chance = max(y.mean(), 1 - y.mean())
    return Separability(float(correct.mean()), lo, hi, len(y), k, float(chance))


def _final_direction(model: Any, objective: str, tokens: torch.Tensor, normed: torch.Tensor,
                     positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w, b = model.reward_direction(objective, normed, tokens, positions)
    w = w.float()
    if is_layernorm(model):
        w = w - w.mean(-1, keepdim=True)
    return w, b.float()


def local_gradient(
    model: Any, h: Float[torch.Tensor, "batch d_model"], w: Float[torch.Tensor, "batch d_model"],
) -> Float[torch.Tensor, "batch d_model"]:
    """``d (w . N(h)) / d h`` per row: the reward's direction in the final residual at ``t*``
    including the final norm's response (autograd through :func:`normalise`, float64)."""
    h = h.detach().double().requires_grad_(True)
    r = (normalise(model, h) * w.double()).sum()
    (g,) = torch.autograd.grad(r, h)
    return g.float()


@dataclass(repr=False)
class ConceptAlignment(ShortRepr):
    """How one concept lines up with one objective, measured at the head (see module doc).

    ``cosine_head``, ``cosine_local`` and ``slope`` are per input ``[n]`` (for a fixed linear
    head ``cosine_head`` is the same for every input).
    """

    concept: str
    layer: int
    objective: str
    cosine_head: Float[torch.Tensor, " n"]
    cosine_local: Float[torch.Tensor, " n"]
    slope: Float[torch.Tensor, " n"]
    spread: float
    separability: Separability | None
    meta: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, float]:
        """Means over inputs, with the mean slope's interval (the inverted sign-flip test)."""
        t = sign_flip_test(self.slope.numpy())
        out = {"cosine_head": float(self.cosine_head.mean()),
               "cosine_local": float(self.cosine_local.mean()),
               "slope": t.mean, "slope_ci_low": t.ci_low, "slope_ci_high": t.ci_high,
               "spread": self.spread}
        if self.separability is not None:
            out |= {"separability": self.separability.accuracy,
                    "separability_ci_low": self.separability.ci_low,
                    "separability_ci_high": self.separability.ci_high}
        return out

    def to_dataframe(self) -> pd.DataFrame:
        """One row per input: its cosines and slope."""
        return pd.DataFrame({"concept": self.concept, "layer": self.layer,
                             "objective": self.objective, "input": range(len(self.slope)),
                             "cosine_head": self.cosine_head.tolist(),
                             "cosine_local": self.cosine_local.tolist(),
                             "slope": self.slope.tolist()})

    def plot(self) -> Any:
        """Per-input slopes and cosines (plotly)."""
        from tl_reward.viz.concepts import concept_alignment_figure

        return concept_alignment_figure([self.summary() | {"concept": self.concept,
                                                           "objective": self.objective}])


def concept_alignment(
    model: Any, concept: ConceptVector, inputs: Sequence[Any], objective: int | str | None = None,
    separability: bool = True, batch_size: int = 8,
) -> ConceptAlignment:
    """Alignment of ``concept`` with ``objective`` at the head, over the inputs ``inputs``."""
    obj = resolve_objectives(model, objective)[0]
    u = concept.unit.to(model.cfg.device)
    cos_head, cos_local, slope = [], [], []
    with torch.no_grad():
        batches = list(residual_batches(model, inputs, model.cfg.n_layers, batch_size))
    for batch, resid, pos in batches:
        resid = resid.float()
        with torch.no_grad():
            w, _ = _final_direction(model, obj, batch.tokens, normalise(model, resid), pos)
        g = local_gradient(model, resid[torch.arange(len(pos), device=pos.device), pos], w)
        cos_head.append(torch.nn.functional.cosine_similarity(w, u[None], dim=-1))
        cos_local.append(torch.nn.functional.cosine_similarity(g, u[None], dim=-1))
        slope.append(concept.spread * (g @ u))
    sep = concept_separability(concept) if separability else None
    return ConceptAlignment(concept.name, concept.layer, obj, torch.cat(cos_head).cpu(),
                            torch.cat(cos_local).cpu(), torch.cat(slope).cpu(), concept.spread,
                            sep, {"n_layers": model.cfg.n_layers})


@dataclass(repr=False)
class SteeringCurve(ShortRepr):
    """The objective as ``alpha * spread * u`` is added at ``t*`` at the concept's layer.

    Attributes:
        alphas: ``[n_alpha]`` strengths in units of the concept's spread.
        rewards: ``[n_alpha, n]`` the objective per strength and input.
        predicted_slope: ``[n]`` the first-order slope at the head (direct path).
        base: ``[n]`` the objective without steering.
    """

    concept: str
    layer: int
    objective: str
    alphas: Float[torch.Tensor, " n_alpha"]
    rewards: Float[torch.Tensor, "n_alpha n"]
    predicted_slope: Float[torch.Tensor, " n"]
    base: Float[torch.Tensor, " n"]

    @property
    def change(self) -> Float[torch.Tensor, "n_alpha n"]:
        """Reward change against the unsteered input."""
        return self.rewards - self.base[None]

    def to_dataframe(self) -> pd.DataFrame:
        """One row per (alpha, input): the reward and its change."""
        a, i = torch.meshgrid(torch.arange(len(self.alphas)), torch.arange(self.rewards.shape[1]),
                              indexing="ij")
        return pd.DataFrame({"concept": self.concept, "layer": self.layer,
                             "objective": self.objective,
                             "alpha": self.alphas[a.flatten()].tolist(),
                             "input": i.flatten().tolist(),
                             "reward": self.rewards.flatten().tolist(),
                             "change": self.change.flatten().tolist()})

    def plot(self) -> Any:
        """Mean reward change against alpha, with the first-order prediction (plotly)."""
        from tl_reward.viz.concepts import steering_figure

        return steering_figure(self.alphas.numpy(), self.change.numpy(),
                               self.predicted_slope.numpy(), self.concept, self.objective)


@torch.no_grad()
def steering_curve(
    model: Any, concept: ConceptVector, inputs: Sequence[Any],
    alphas: Sequence[float] = (-3, -2, -1, -0.5, 0.5, 1, 2, 3),
    objective: int | str | None = None, batch_size: int = 8,
) -> SteeringCurve:
    """Add ``alpha * spread * u`` to the residual at ``t*`` at the concept's layer and record the
    objective (read at the head as the model reads it, norm recomputed)."""
    obj = resolve_objectives(model, objective)[0]
    hook = resid_hook(model, concept.layer)
    final_hook = resid_hook(model, model.cfg.n_layers)
    step = (concept.unit * concept.spread).to(model.cfg.device)
    encoded = encode_inputs(model, inputs)
    grid = [0.0, *[float(a) for a in alphas]]
    rewards = torch.empty(len(grid), len(encoded))
    for s in range(0, len(encoded), batch_size):
        batch = model.collate(encoded[s : s + batch_size], "right")
        pos = batch.pooled
        rows = torch.arange(len(pos), device=pos.device)
        for j, alpha in enumerate(grid):
            store: dict[str, torch.Tensor] = {}

            def add(act: torch.Tensor, hook: Any, alpha: float = alpha, rows: torch.Tensor = rows,
                    pos: torch.Tensor = pos) -> torch.Tensor:
                act = act.clone()
                act[rows, pos] += (alpha * step).to(act.dtype)
                return act

            def grab(act: torch.Tensor, hook: Any, store: dict = store) -> None:
                store["final"] = act

            with model.hooks(fwd_hooks=[(hook, add), (final_hook, grab)]):
                model(batch.tokens, attention_mask=batch.attention_mask, return_type=None)
            normed = normalise(model, store["final"].float())
            w, b = _final_direction(model, obj, batch.tokens, normed, pos)
            r = (w * normed[rows, pos]).sum(-1) + b
            rewards[j, s : s + len(pos)] = r.cpu()
    with torch.enable_grad():
        align = concept_alignment(model, concept, inputs, obj, separability=False,
                                  batch_size=batch_size)
    return SteeringCurve(concept.name, concept.layer, obj, torch.tensor(grid[1:]), rewards[1:],
                         align.slope, rewards[0])
