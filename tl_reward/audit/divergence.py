"""Divergence-aware patching: is a patched-in activation one the model ever sees naturally?

Activation patching writes a source activation into a target run. If that activation lies far
outside what the site produces on natural inputs, the patch's effect says little about how the
model works. We model each site's natural activations and attach to every patch the
distance of its patched-in value and an empirical p-value:

1. :func:`fit_divergence` collects a site's activations on natural inputs at every real token
   (position 0, the attention-sink token whose norm dwarfs the rest, is left out by default),
   splits the *inputs* in two, fits a Gaussian on the first part (Ledoit-Wolf shrinkage
   covariance, or a PCA subspace with ``k < n``: see :mod:`tl_reward.audit.covariance`) and keeps
   the Mahalanobis distances of the second, held-out part as the reference;
2. a patched-in activation's p-value is ``(1 + #{held-out distance >= d}) / (1 + n_heldout)``:
   the share of natural activations at least as far out (uniform under the null that it is one
   more natural activation; no fixed threshold such as "distance > 2", which in ``d``
   dimensions nearly every natural activation exceeds);
3. :func:`divergence_patching` runs :func:`tl_reward.analysis.patching.activation_patching`
   unchanged and flags (never drops) the patches whose source is off-distribution
   (``p < alpha``). For ``positions="all"`` a patch writes several positions; its p-value is
   the Bonferroni-adjusted minimum over them. When the fit left position 0 out
   (``skip_first``), a patch whose source is position 0 is not scored (distance and p-value
   NaN, never flagged, ``meta["not_scored"]`` says why): the fit says nothing about it.

A site that was not fitted is an error, never "in distribution".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.analysis.patching import PatchingResult, activation_patching, site_hook
from tl_reward.audit.covariance import GaussianFit, fit_gaussian
from tl_reward.data.pairs import as_tokenized_pair
from tl_reward.errors import TLRewardError
from tl_reward.model.inputs import cached_batches, encode_inputs
from tl_reward.results import ShortRepr

SiteKey = tuple[str, int | None]  # (hook name, unit or None)


@dataclass
class SiteFit:
    """One site's natural distribution: the Gaussian fit and the held-out reference distances."""

    hook: str
    unit: int | None
    fit: GaussianFit
    reference: np.ndarray  # sorted held-out distances

    def p_value(self, x: Float[torch.Tensor, "... d"]) -> np.ndarray:
        """``(1 + #{reference >= d(x)}) / (1 + n_reference)`` for each row of ``x``."""
        d = self.fit.distance(x).cpu().numpy()
        n_ge = len(self.reference) - np.searchsorted(self.reference, d, side="left")
        return (1 + n_ge) / (1 + len(self.reference))


@dataclass
class DivergenceModel:
    """Fitted natural distributions of patching sites (see :func:`fit_divergence`)."""

    fits: dict[SiteKey, SiteFit]
    method: str
    n_fit_inputs: int
    n_reference_inputs: int
    skip_first: bool = True

    def site(self, hook: str, unit: int | None = None) -> SiteFit:
        """The fit of one site; an unfitted site is an error."""
        key = (hook, unit)
        if key not in self.fits:
            fitted = sorted({h for h, _ in self.fits})
            raise TLRewardError(
                f"site {hook!r}{'' if unit is None else f' unit {unit}'} was not fitted; "
                f"fitted hooks: {fitted}. Call fit_divergence(model, natural, sites=[...]) "
                "with this site included (a site without a fit is never assumed in distribution)"
            )
        return self.fits[key]

    def distance(self, hook: str, x: torch.Tensor, unit: int | None = None) -> np.ndarray:
        """Mahalanobis distance of each activation row at a site."""
        return self.site(hook, unit).fit.distance(x).cpu().numpy()

    def p_value(self, hook: str, x: torch.Tensor, unit: int | None = None) -> np.ndarray:
        """Empirical p-value of each activation row at a site (small: off-distribution)."""
        return self.site(hook, unit).p_value(x)


def _unit_slice(hook: str, act: torch.Tensor, unit: int | None) -> torch.Tensor:
    """``[..., d]`` rows of one unit: a head's ``d_head`` vector (``hook_z``), a neuron as a
    1-vector; the whole activation when ``unit`` is None."""
    if unit is None:
        return act
    return act[..., unit, :] if hook.endswith("hook_z") else act[..., unit : unit + 1]


@torch.no_grad()
def _collect(model: Any, inputs: Sequence[Any], hooks: set[str], skip_first: bool,
             batch_size: int) -> dict[str, torch.Tensor]:
    out: dict[str, list[torch.Tensor]] = {h: [] for h in hooks}
    encoded = encode_inputs(model, inputs)
    for batch, cache in cached_batches(model, encoded, batch_size, hooks):
        mask = batch.attention_mask.bool().clone()
        if skip_first:
            mask[:, 0] = False
        for h in hooks:
            out[h].append(cache[h][mask].double())
    return {h: torch.cat(v) for h, v in out.items()}


def fit_divergence(
    model: Any, natural: Sequence[Any], sites: Sequence[tuple[str, int]],
    method: str = "ledoit_wolf", k: int | None = None, reference_fraction: float = 0.5,
    skip_first: bool = True, seed: int = 0, batch_size: int = 8,
) -> DivergenceModel:
    """Fit each site's natural activations on part of ``natural`` and keep the distances of the
    held-out part as the reference (split by input, ``reference_fraction`` held out).

    ``sites``: ``(kind, layer)`` with kind ``"resid"``, ``"attn_out"``, ``"mlp_out"``, ``"head"``
    (each head of the layer fitted separately on its ``hook_z`` vector) or ``"neuron"`` (each
    neuron separately). ``method``: ``"ledoit_wolf"`` or ``"pca"`` (``k`` components, ``k < n``).
    """
    n = len(natural)
    n_ref = int(round(reference_fraction * n))
    if n_ref < 2 or n - n_ref < 2:
        raise TLRewardError(f"need at least 2 fit and 2 reference inputs; got {n} natural "
                            f"inputs with reference_fraction={reference_fraction}")
    perm = np.random.default_rng(seed).permutation(n)
    fit_in = [natural[i] for i in perm[n_ref:]]
    ref_in = [natural[i] for i in perm[:n_ref]]
    keyed = [(kind, site_hook(model, kind, layer)[0]) for kind, layer in sites]
    hooks = {h for _, h in keyed}
    acts_fit = _collect(model, fit_in, hooks, skip_first, batch_size)
    acts_ref = _collect(model, ref_in, hooks, skip_first, batch_size)
    fits: dict[SiteKey, SiteFit] = {}
    for kind, hook in keyed:
        n_units = {"head": model.cfg.n_heads, "neuron": model.cfg.d_mlp}.get(kind)
        for unit in [None] if n_units is None else range(n_units):
            xf = _unit_slice(hook, acts_fit[hook], unit)
            xr = _unit_slice(hook, acts_ref[hook], unit)
            g = fit_gaussian(xf, method, k)
            fits[(hook, unit)] = SiteFit(hook, unit, g, np.sort(g.distance(xr).cpu().numpy()))
    return DivergenceModel(fits, method, len(fit_in), len(ref_in), skip_first)


@dataclass(repr=False)
class DivergentPatchingResult(ShortRepr):
    """A :class:`PatchingResult` with, per patch, how unnatural its patched-in value is.

    Attributes:
        patching: the unchanged patching result (effects are kept for every patch).
        distance: Mahalanobis distance of the patched-in value (max over positions for
            ``positions="all"``), shaped like ``patching.effect``.
        p_value: empirical p-value (Bonferroni-adjusted minimum over positions for "all");
            NaN where not scored (a source at position 0 outside a ``skip_first`` fit).
        off_distribution: ``p_value < alpha`` (False where not scored).
    """

    patching: PatchingResult
    distance: np.ndarray
    p_value: np.ndarray
    alpha: float
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def off_distribution(self) -> np.ndarray:
        return self.p_value < self.alpha

    def to_dataframe(self) -> pd.DataFrame:
        """The patching table with ``distance``, ``p_value`` and ``off_distribution`` columns."""
        return self.patching.to_dataframe().assign(
            distance=self.distance.flatten(), p_value=self.p_value.flatten(),
            off_distribution=self.off_distribution.flatten())

    def plot(self) -> Any:
        """The patching view, titled with the share of off-distribution patches."""
        fig = self.patching.plot()
        share = float(self.off_distribution.mean())
        fig.update_layout(title=f"{fig.layout.title.text or 'Patching'} "
                                f"({share:.0%} of patches off-distribution at p < {self.alpha})")
        return fig


@torch.no_grad()
def divergence_patching(
    model: Any, pair: Any, divergence: DivergenceModel, site: str = "resid",
    mode: str = "denoising", positions: str = "each", layers: Sequence[int] | None = None,
    units: Sequence[int] | None = None, objective: int | str | None = None,
    reference: Sequence[Any] | dict[str, torch.Tensor] | None = None, alpha: float = 0.05,
    **patching_kwargs: Any,
) -> DivergentPatchingResult:
    """:func:`activation_patching` plus each patch's distance and p-value under ``divergence``.

    The patched-in value is the source run's activation at the aligned source row (denoising:
    chosen; noising: rejected), zero, or the reference mean, as the patch writes it. Source
    position 0 outside a ``skip_first`` fit is not scored (see the module doc).
    """
    res = activation_patching(model, pair, site=site, mode=mode, positions=positions,
                              layers=layers, units=units, objective=objective,
                              reference=reference, **patching_kwargs)
    tp = as_tokenized_pair(model, pair)
    hooks = {site_hook(model, site, layer)[0] for layer in res.layers}
    for h in hooks:  # fail before any work on an unfitted site
        for u in (res.units or [None]):
            divergence.site(h, u)
    src_side = "chosen" if mode == "denoising" else "rejected"
    col = 0 if src_side == "chosen" else 1
    src_rows = tp.aligned[:, col]
    tokens = tp.tokens(src_side).to(model.cfg.device)
    _, cache = model.run_with_cache(tokens, attention_mask=torch.ones_like(tokens),
                                    return_type=None, names_filter=lambda n: n in hooks)
    means = None
    if mode == "mean":
        from tl_reward.analysis.patching import mean_activations

        # activation_patching above has refused mode='mean' without reference=
        means = reference if isinstance(reference, dict) else mean_activations(
            model, reference, sorted(hooks))
    rows: list[int | None] = list(range(tp.n_aligned)) if positions == "each" else [None]
    dist, pval = [], []
    for layer in res.layers:
        hook = site_hook(model, site, layer)[0]
        for unit in (res.units or [None]):
            sf = divergence.site(hook, unit)
            for r in rows:
                idx = src_rows if r is None else src_rows[r : r + 1]
                if divergence.skip_first:
                    idx = idx[idx != 0]  # position 0 lies outside the fit: not scored
                if len(idx) == 0:
                    dist.append(float("nan"))
                    pval.append(float("nan"))
                    continue
                idx = idx.to(model.cfg.device)
                act = cache[hook][0, idx]
                if mode == "zero":
                    act = torch.zeros_like(act)
                elif mode == "mean":
                    act = means[hook].to(act.device, act.dtype).expand_as(act)
                x = _unit_slice(hook, act, unit)
                d = sf.fit.distance(x).cpu().numpy()
                p = sf.p_value(x)
                dist.append(float(d.max()))
                pval.append(float(min(1.0, p.min() * len(p))))
    shape = tuple(res.effect.shape)
    return DivergentPatchingResult(res, np.array(dist).reshape(shape),
                                   np.array(pval).reshape(shape), alpha,
                                   {"method": divergence.method, "not_scored": (
                                       "source position 0 (BOS): outside the fit "
                                       "(skip_first=True)" if divergence.skip_first else None)})
