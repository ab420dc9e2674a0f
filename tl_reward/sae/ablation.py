"""Causal check of SAE feature attributions: ablate features, compare with the prediction.

Ablating feature ``i`` at hook ``H`` sets ``f_i = 0`` at every position while the SAE's error
node keeps the rest of the activation as it was (SAELens's ``use_error_term=True``), so the
activation becomes ``x - f_i d_i`` and nothing else changes. Gradient attribution predicts the
reward change as ``-a_i = -sum_t f_i(t) d_i . dr/dx(t)``; the actual change comes from a forward
pass. For pairs the quantity is the change in the margin ``r(chosen) - r(rejected)``.

The report gives the Pearson and Spearman correlation of predicted against actual over the top
features of every input, the largest absolute error and the share of features within a stated
tolerance ``|predicted - actual| <= atol + rtol |actual|``; :attr:`AblationCheck.joint_predicted`
and ``joint_actual`` do the same for the top features ablated together.

Example:
    >>> check = ablation_check(model, sae, inputs, top_k=10)
    >>> check.summary()
    >>> check.plot()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float
from scipy import stats
from tqdm.auto import tqdm

from tl_reward.data.pairs import as_pair_batch
from tl_reward.errors import TLRewardError
from tl_reward.model.inputs import as_items
from tl_reward.model.readout import resolve_objectives
from tl_reward.results import ShortRepr
from tl_reward.sae.attribution import differential_sae_attribution, sae_attribution
from tl_reward.sae.splice import as_sae_model, decoder_directions, restart_layer, run_objectives


@dataclass(repr=False)
class AblationCheck(ShortRepr):
    """Predicted (attribution) against actual (ablation) reward changes.

    Attributes:
        hook_name, method, objective: what was checked.
        kind: ``"input"`` (reward change) or ``"pair"`` (margin change).
        item: ``[M]`` the input or pair of each row; ``feature``: ``[M]`` the feature ablated.
        predicted: ``[M]`` ``-a_i`` (or ``-(a_i(chosen) - a_i(rejected))`` for pairs).
        actual: ``[M]`` the measured change.
        joint_predicted, joint_actual: ``[N]`` the same with each item's top features
            ablated together.
        atol, rtol: the tolerance :attr:`within_tolerance` uses.
    """

    hook_name: str
    method: str
    objective: str
    kind: str
    item: torch.Tensor
    feature: torch.Tensor
    predicted: Float[torch.Tensor, " m"]
    actual: Float[torch.Tensor, " m"]
    joint_predicted: Float[torch.Tensor, " n"]
    joint_actual: Float[torch.Tensor, " n"]
    atol: float = 1e-2
    rtol: float = 0.2

    @property
    def pearson(self) -> float:
        """Pearson correlation of predicted against actual over all rows."""
        if len(self.predicted) < 2:
            return float("nan")
        return float(stats.pearsonr(self.predicted.numpy(), self.actual.numpy())[0])

    @property
    def spearman(self) -> float:
        """Spearman rank correlation of predicted against actual over all rows."""
        if len(self.predicted) < 2:
            return float("nan")
        return float(stats.spearmanr(self.predicted.numpy(), self.actual.numpy())[0])

    @property
    def abs_error(self) -> Float[torch.Tensor, " m"]:
        return (self.predicted - self.actual).abs()

    @property
    def within_tolerance(self) -> torch.Tensor:
        """Rows with ``|predicted - actual| <= atol + rtol |actual|``."""
        return self.abs_error <= self.atol + self.rtol * self.actual.abs()

    @property
    def sign_agreement(self) -> float:
        """Share of rows where prediction and ablation agree in sign (non-zero actual)."""
        nz = self.actual != 0
        return float((torch.sign(self.predicted[nz]) == torch.sign(self.actual[nz])).float()
                     .mean()) if bool(nz.any()) else float("nan")

    def summary(self) -> pd.DataFrame:
        """One-row table: correlations, errors, tolerance, sign agreement, joint ablation."""
        jp, ja = self.joint_predicted.numpy(), self.joint_actual.numpy()
        joint_r = float(stats.pearsonr(jp, ja)[0]) if len(jp) > 1 else float("nan")
        return pd.DataFrame([{
            "hook": self.hook_name, "method": self.method, "objective": self.objective,
            "kind": self.kind, "n_checks": len(self.predicted),
            "pearson": self.pearson, "spearman": self.spearman,
            "max_abs_error": float(self.abs_error.max()) if len(self.predicted) else 0.0,
            "median_abs_error": float(self.abs_error.median()) if len(self.predicted) else 0.0,
            "median_abs_actual": float(self.actual.abs().median()) if len(self.actual) else 0.0,
            "atol": self.atol, "rtol": self.rtol,
            "frac_within_tolerance": float(self.within_tolerance.float().mean()),
            "sign_agreement": self.sign_agreement, "joint_pearson": joint_r,
        }])

    def to_dataframe(self) -> pd.DataFrame:
        """One row per ablated feature: item, feature, predicted, actual, error, within."""
        return pd.DataFrame({
            self.kind: self.item.tolist(), "feature": self.feature.tolist(),
            "predicted": self.predicted.tolist(), "actual": self.actual.tolist(),
            "abs_error": self.abs_error.tolist(),
            "within_tolerance": self.within_tolerance.tolist(),
        })

    def plot(self) -> Any:
        """Scatter of predicted against actual change, with the identity line."""
        from tl_reward.viz.sae_views import ablation_scatter

        return ablation_scatter(self)


def ablate_rows(
    model: Any, sae: Any, tokens: torch.Tensor, mask: torch.Tensor,
    feature_sets: Sequence[Sequence[int]], objectives: Sequence[str],
    resid: torch.Tensor | None = None, fast: bool = True,
) -> Float[torch.Tensor, "batch n_obj"]:
    """The objectives of a batch with row ``r``'s features ``feature_sets[r]`` zeroed at every
    position, the SAE's error node on (so the rest of the activation is untouched).

    For a ``blocks.L.hook_resid_post`` SAE (``fast=True``; not on a bridge) the run restarts
    at block ``L + 1`` from ``x - sum_i f_i d_i`` (``resid``: the clean activation, computed if
    not given), which is what SAELens's splice with the error term gives; otherwise the SAE is
    spliced in with ``model.saes(..., use_error_term=True)`` and a hook zeroes the features.
    """
    hook = sae.cfg.metadata.hook_name
    drop = torch.zeros(tokens.shape[0], sae.cfg.d_sae, device=tokens.device, dtype=sae.dtype)
    for r, feats in enumerate(feature_sets):
        drop[r, list(feats)] = 1.0
    layer = restart_layer(model, hook)
    with torch.no_grad():
        if fast and layer is not None:
            if resid is None:
                resid = model(tokens, attention_mask=mask, stop_at_layer=layer + 1)
            f = sae.encode(resid.to(sae.dtype)) * drop[:, None, :]
            x = resid - (f @ decoder_directions(sae)).to(resid.dtype)
            return run_objectives(model, tokens, mask, objectives, x, layer + 1).float().cpu()

        def zero(acts: torch.Tensor, hook: Any) -> torch.Tensor:
            return acts * (1 - drop)[:, None, :]

        with model.saes(saes=[sae], use_error_term=True):
            with model.hooks(fwd_hooks=[(model.get_sae_hook_name(sae), zero)]):
                return run_objectives(model, tokens, mask, objectives).float().cpu()


def ablated_objectives(
    model: Any, sae: Any, tokens: torch.Tensor, mask: torch.Tensor,
    feature_sets: Sequence[Sequence[int]], objectives: Sequence[str], batch_size: int = 16,
    fast: bool = True,
) -> Float[torch.Tensor, "n_sets n_obj"]:
    """The objectives of one input (``tokens`` ``[1, pos]``) with each set of features zeroed
    at every position (see :func:`ablate_rows`), in batches of ``batch_size`` sets; the blocks
    before the SAE run once."""
    layer = restart_layer(model, sae.cfg.metadata.hook_name)
    resid = None
    if fast and layer is not None:
        with torch.no_grad():
            resid = model(tokens, attention_mask=mask, stop_at_layer=layer + 1)
    out = []
    for s in range(0, len(feature_sets), batch_size):
        sets = feature_sets[s : s + batch_size]
        n = len(sets)
        out.append(ablate_rows(model, sae, tokens.expand(n, -1), mask.expand(n, -1), sets,
                               objectives, None if resid is None else resid.expand(n, -1, -1),
                               fast))
    return torch.cat(out)


def _top(vals: torch.Tensor, k: int) -> list[int]:
    order = vals.abs().argsort(descending=True)[:k]
    return [int(i) for i in order if vals[i] != 0]


def ablation_check(
    model: Any, sae: Any, inputs: Any, top_k: int = 10, objective: int | str | None = None,
    method: str = "gradient", atol: float = 1e-2, rtol: float = 0.2, batch_size: int = 16,
    progress: bool | None = None,
) -> AblationCheck:
    """Ablate each input's ``top_k`` features (by ``|attribution|``) one at a time and all
    together, and compare the reward change with the attribution's prediction.

    Args:
        objective: the objective checked (default: the model's first default objective).
        method: the attribution checked (``"gradient"``, or ``"exact"`` at the final residual,
            where the actual change also moves the norm scale).
    """
    model = as_sae_model(model)
    items = as_items(inputs)
    attr = sae_attribution(model, sae, items, objectives=resolve_objectives(model, objective)[:1],
                           method=method, progress=progress)
    j = 0
    name = attr.objectives[j]
    rows: list[tuple[int, int, float, float]] = []
    jp, ja = [], []
    for i in tqdm(range(len(items)), disable=not progress, desc="ablation", unit="input"):
        feats = _top(attr.features[i, :, j], top_k)
        batch = model.make_batch(items[i])
        vals = ablated_objectives(model, sae, batch.tokens, batch.attention_mask,
                                  [[f] for f in feats] + [feats], [name], batch_size)[:, 0]
        base = float(attr.reward[i, j])
        for r, f in enumerate(feats):
            rows.append((i, f, -float(attr.features[i, f, j]), float(vals[r]) - base))
        jp.append(-float(attr.features[i, feats, j].sum()))
        ja.append(float(vals[-1]) - base)
    return _result(attr.hook_name, attr.method, name, "input", rows, jp, ja, atol, rtol)


def pair_ablation_check(
    model: Any, sae: Any, pairs: Any, top_k: int = 10, objective: int | str | None = None,
    method: str = "gradient", atol: float = 1e-2, rtol: float = 0.2, batch_size: int = 16,
    progress: bool | None = None,
) -> AblationCheck:
    """As :func:`ablation_check` for the margin ``r(chosen) - r(rejected)`` of preference
    pairs: the features with the largest ``|a_i(chosen) - a_i(rejected)|`` are ablated in both
    replies."""
    model = as_sae_model(model)
    batch = as_pair_batch(model, pairs)
    pa = differential_sae_attribution(model, sae, batch,
                                      objectives=resolve_objectives(model, objective)[:1],
                                      method=method, progress=progress)
    name = pa.objectives[0]
    diff = pa.difference()[..., 0]
    rows: list[tuple[int, int, float, float]] = []
    jp, ja = [], []
    for i, tp in enumerate(tqdm(list(batch), disable=not progress, desc="ablation",
                                unit="pair")):
        feats = _top(diff[i], top_k)
        sets = [[f] for f in feats] + [feats]
        changes = []
        for side, attr in (("chosen", pa.chosen), ("rejected", pa.rejected)):
            toks = tp.tokens(side).to(model.cfg.device)
            vals = ablated_objectives(model, sae, toks, torch.ones_like(toks), sets, [name],
                                      batch_size)[:, 0]
            changes.append(vals - float(attr.reward[i, 0]))
        delta = changes[0] - changes[1]
        for r, f in enumerate(feats):
            rows.append((i, f, -float(diff[i, f]), float(delta[r])))
        jp.append(-float(diff[i, feats].sum()))
        ja.append(float(delta[-1]))
    return _result(pa.chosen.hook_name, pa.chosen.method, name, "pair", rows, jp, ja, atol,
                   rtol)


def _result(hook: str, method: str, objective: str, kind: str,
            rows: list[tuple[int, int, float, float]], jp: list[float], ja: list[float],
            atol: float, rtol: float) -> AblationCheck:
    if not rows:
        raise TLRewardError("no active features to ablate (every attribution is zero)")
    t = list(zip(*rows, strict=True))
    return AblationCheck(
        hook_name=hook, method=method, objective=objective, kind=kind,
        item=torch.tensor(t[0]), feature=torch.tensor(t[1]),
        predicted=torch.tensor(t[2]), actual=torch.tensor(t[3]),
        joint_predicted=torch.tensor(jp), joint_actual=torch.tensor(ja), atol=atol, rtol=rtol,
    )
