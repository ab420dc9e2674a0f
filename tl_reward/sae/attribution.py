"""The reward as a sum over SAE features: exact at the final residual, gradient-based earlier.

A SAELens SAE at hook ``H`` encodes ``f = enc(x)`` and decodes ``x_hat = f W_dec + b_dec``
(``W_dec`` rows taken at unit norm when the SAE was trained with
``rescale_acts_by_decoder_norm``). Every activation splits exactly into
``x = sum_i f_i d_i + b_dec + eps`` with the reconstruction error ``eps = x - x_hat``.

* **Exact** (``H`` = the last block's ``hook_resid_post``): at the pooled token ``t*`` the
  reward is ``r = w . x / s + b`` with the final norm's scale ``s`` frozen (``w`` centred for
  LayerNorm; ArmoRM's ``"score"`` uses ``w_eff(x)``, its gate frozen too), so
  ``a_i = f_i (d_i . w) / s``, ``a_bdec = b_dec . w / s``, ``a_err = eps . w / s`` and
  ``sum_i a_i + a_bdec + a_err + b = r`` exactly. Published tools drop ``b_dec``, ``eps`` and
  ``s``; their feature contributions do not add up to the reward.
* **Gradient** (any hook): with the SAE attached with its error node (rewards unchanged),
  ``a_i = sum_t f_i(t) d_i . dr/dx(t)`` over every position ``t``, plus the ``b_dec`` and error
  nodes' terms (together ``sum_t x(t) . dr/dx(t)``). A first-order estimate of what removing
  feature ``i`` does: :func:`tl_reward.sae.ablation_check` measures it.

``reconstruction_gap`` is the measured reward change when the SAE's reconstruction replaces the
activation (error term off). At the final residual it differs from ``-a_err`` because the norm
scale is recomputed from ``x_hat``; both are reported.

Example:
    >>> attr = sae_attribution(model, sae, [("Is the sky blue?", "Yes.")])
    >>> attr.total()          # equals the model's rewards (exact mode)
    >>> attr.top_features(10)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float, Int

from tl_reward.data.pairs import PairBatch, as_pair_batch
from tl_reward.model.heads import objective_slot
from tl_reward.model.inputs import as_items, input_batches
from tl_reward.model.readout import ObjectiveSpec, resolve_objectives, reward_readout
from tl_reward.model.steps import StepRow, StepSpec
from tl_reward.results import PairSides, ShortRepr
from tl_reward.sae.splice import (
    SAEError,
    as_sae_model,
    check_affine_sae,
    check_sae,
    decoder_directions,
    final_hook,
    run_objectives,
)

METHODS = ("auto", "exact", "gradient")


@dataclass(repr=False)
class SAEAttribution(ShortRepr):
    """Per-feature reward attribution of N inputs at one SAE (tensors on CPU).

    Attributes:
        hook_name: the hook the SAE reads.
        method: ``"exact"`` (final residual, frozen norm scale) or ``"gradient"``.
        objectives: the objective names (last axis of every tensor).
        features: ``[N, d_sae, n_obj]`` each feature's contribution (summed over positions for
            ``"gradient"``; at the pooled token for ``"exact"``).
        b_dec: ``[N, n_obj]`` the decoder bias's contribution.
        error: ``[N, n_obj]`` the error node's contribution (reconstruction error).
        bias: ``[N, n_obj]`` the head's own bias (``"exact"``; zero for ``"gradient"``).
        reward: ``[N, n_obj]`` the model's rewards.
        reconstruction_gap: ``[N, n_obj]`` the reward change when the SAE's reconstruction
            replaces the activation at every position (error term off), measured.
        activations: ``[N, d_sae]`` feature activations at the pooled token.
        positions: ``[N]`` the pooled token; ``scale``: ``[N]`` the frozen final-norm scale
            (``nan`` for ``"gradient"``).
        tokens: per input, its token strings.
        steps: a process reward model's (input, step) of each row (``step=``), else None.
    """

    hook_name: str
    method: str
    objectives: list[str]
    features: Float[torch.Tensor, "n d_sae n_obj"]
    b_dec: Float[torch.Tensor, "n n_obj"]
    error: Float[torch.Tensor, "n n_obj"]
    bias: Float[torch.Tensor, "n n_obj"]
    reward: Float[torch.Tensor, "n n_obj"]
    reconstruction_gap: Float[torch.Tensor, "n n_obj"]
    activations: Float[torch.Tensor, "n d_sae"]
    positions: Int[torch.Tensor, " n"]
    scale: Float[torch.Tensor, " n"]
    tokens: list[list[str]]
    steps: list[StepRow] | None = None

    def __len__(self) -> int:
        return self.reward.shape[0]

    @property
    def d_sae(self) -> int:
        return self.features.shape[1]

    def total(self) -> Float[torch.Tensor, "n n_obj"]:
        """Features + ``b_dec`` + error + head bias. Equals ``reward`` for ``"exact"``; for
        ``"gradient"`` it is the first-order total ``sum_t x(t) . dr/dx(t)``."""
        return self.features.sum(1) + self.b_dec + self.error + self.bias

    def top_features(
        self, k: int = 10, index: int | None = None, objective: int | str = 0
    ) -> pd.DataFrame:
        """The ``k`` features with the largest absolute contribution, for input ``index`` or
        averaged over inputs (``None``)."""
        j = objective_slot(self.objectives, objective)
        vals = self.features[..., j]
        if index is None:
            freq = (vals != 0).float().mean(0)
            vals, acts = vals.mean(0), self.activations.mean(0)
        else:
            vals, acts = vals[index], self.activations[index]
            freq = (vals != 0).float()
        order = vals.abs().argsort(descending=True)[:k]
        return pd.DataFrame({
            "feature": order.tolist(),
            "contribution": vals[order].tolist(),
            "activation_at_pooled": acts[order].tolist(),
            "frac_inputs_active": freq[order].tolist(),
        })

    def to_dataframe(self) -> pd.DataFrame:
        """Long table of the non-zero terms: input, objective, term (a feature id, ``"b_dec"``,
        ``"error"`` or ``"bias"``), contribution."""
        rows: list[tuple[int, str, str, float]] = []
        for k, obj in enumerate(self.objectives):
            nz = self.features[..., k].nonzero().tolist()
            rows += [(i, obj, str(f), float(self.features[i, f, k])) for i, f in nz]
            for i in range(len(self)):
                rows += [(i, obj, "b_dec", float(self.b_dec[i, k])),
                         (i, obj, "error", float(self.error[i, k])),
                         (i, obj, "bias", float(self.bias[i, k]))]
        df = pd.DataFrame(rows, columns=["input", "objective", "term", "contribution"])
        return df.sort_values(["input", "objective"], kind="stable").reset_index(drop=True)

    def plot(self, k: int = 20, index: int | None = None, objective: int | str = 0) -> Any:
        """Bars of the top ``k`` features plus the ``b_dec`` and error terms, for one input or
        the mean over inputs."""
        from tl_reward.viz.sae_views import attribution_bar

        j = objective_slot(self.objectives, objective)
        rows = slice(None) if index is None else slice(index, index + 1)
        title = (f"SAE features at {self.hook_name} ({self.method}, {self.objectives[j]})")
        return attribution_bar(self.top_features(k, index, objective),
                               float(self.b_dec[rows, j].mean()),
                               float(self.error[rows, j].mean()), title)


@dataclass(repr=False)
class PairSAEAttribution(PairSides, ShortRepr):
    """SAE attribution of the chosen and rejected reply of N pairs, and their difference."""

    chosen: SAEAttribution
    rejected: SAEAttribution

    def __len__(self) -> int:
        return len(self.chosen)

    @property
    def hook_name(self) -> str:
        return self.chosen.hook_name

    def difference(self) -> Float[torch.Tensor, "n d_sae n_obj"]:
        """``a_i(chosen) - a_i(rejected)`` per feature. Features are global, so no position
        alignment is needed; with the ``b_dec``, error and bias differences they sum to the
        margin (exact mode)."""
        return self.chosen.features - self.rejected.features

    def total(self) -> Float[torch.Tensor, "n n_obj"]:
        """Sum of every term's difference (equals :attr:`margin` in exact mode)."""
        return self.chosen.total() - self.rejected.total()

    def top_features(self, k: int = 10, objective: int | str = 0) -> pd.DataFrame:
        """Features ranked by mean absolute chosen-minus-rejected contribution over pairs, with
        the mean difference, how often it favours chosen where active, and in how many pairs
        it is active in either reply."""
        j = objective_slot(self.objectives, objective)
        d = self.difference()[..., j]
        active = (self.chosen.features[..., j] != 0) | (self.rejected.features[..., j] != 0)
        score = d.abs().mean(0)
        order = score.argsort(descending=True)[:k]
        n_active = active.sum(0)
        favours = ((d > 0) & active).sum(0).float() / n_active.clamp(min=1)
        return pd.DataFrame({
            "feature": order.tolist(),
            "mean_abs_difference": score[order].tolist(),
            "mean_difference": d.mean(0)[order].tolist(),
            "frac_favours_chosen": favours[order].tolist(),
            "n_pairs_active": n_active[order].tolist(),
        })

    def to_dataframe(self) -> pd.DataFrame:
        """Long table: pair, objective, feature, chosen, rejected and difference (non-zero)."""
        rows = []
        for k, obj in enumerate(self.objectives):
            c, r = self.chosen.features[..., k], self.rejected.features[..., k]
            for i, f in ((c != 0) | (r != 0)).nonzero().tolist():
                rows.append((i, obj, f, float(c[i, f]), float(r[i, f]),
                             float(c[i, f] - r[i, f])))
        return pd.DataFrame(rows, columns=["pair", "objective", "feature", "chosen",
                                           "rejected", "difference"])

    def plot(self, k: int = 20, objective: int | str = 0) -> Any:
        """Bars of the top ``k`` features by chosen-minus-rejected contribution."""
        from tl_reward.viz.sae_views import pair_difference_bar

        j = objective_slot(self.objectives, objective)
        return pair_difference_bar(self.top_features(k, objective),
                                   f"Chosen - rejected SAE features at {self.hook_name} "
                                   f"({self.objectives[j]})")


@torch.no_grad()
def _exact_batch(model: Any, sae: Any, tokens: torch.Tensor, mask: torch.Tensor,
                 objectives: ObjectiveSpec) -> dict[str, Any]:
    hook = final_hook(model)
    _, cache = model.run_with_cache(tokens, attention_mask=mask, return_type=None,
                                    names_filter=lambda n: n == hook)
    x = cache[hook]
    ro = reward_readout(model, x, tokens, mask, objectives)
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    x_t = x[rows, ro.positions].to(sae.dtype)
    f = sae.encode(x_t)
    w_dec = decoder_directions(sae)
    recon = f @ w_dec + sae.b_dec
    if not torch.allclose(recon, sae.decode(f), atol=1e-4, rtol=1e-4):
        raise SAEError(
            f"{type(sae).__name__}.decode is not f @ W_dec + b_dec; this SAE variant is not "
            "supported for an exact decomposition (use method='gradient')"
        )
    # the projections in float64: feature terms and the error can be large and cancel
    d64 = torch.float64
    dirs = ro.directions.to(d64) / ro.scale[:, None, None].to(d64)
    feat = f.to(d64)[..., None] * torch.einsum("sd,bkd->bsk", w_dec.to(d64), dirs)
    b_dec = torch.einsum("d,bkd->bk", sae.b_dec.to(d64), dirs)
    err = torch.einsum("bd,bkd->bk", x_t.to(d64) - recon.to(d64), dirs)
    # the reconstruction in place of x at every position; final norm (and gate) recomputed
    x_hat = sae.decode(sae.encode(x.to(sae.dtype))).to(x.dtype)
    with model.hooks(fwd_hooks=[(hook, lambda t, hook: x_hat)]):
        spliced = run_objectives(model, tokens, mask, ro.objectives)
    return {"features": feat, "b_dec": b_dec, "error": err, "bias": ro.bias,
            "reward": ro.reward, "gap": spliced - ro.reward, "acts": f,
            "positions": ro.positions, "scale": ro.scale, "objectives": ro.objectives}


def _gradient_batch(model: Any, sae: Any, tokens: torch.Tensor, mask: torch.Tensor,
                    objectives: ObjectiveSpec) -> dict[str, Any]:
    names = resolve_objectives(model, objectives)
    store: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Any:
        def fn(t: torch.Tensor, hook: Any) -> torch.Tensor:
            if t.requires_grad:
                t.retain_grad()
            store[name] = t
            return t
        return fn

    fwd = [(model.get_sae_hook_name(sae, f"hook_sae_{k}"), keep(k))
           for k in ("acts_post", "output", "error")]
    with model.saes(saes=[sae], use_error_term=True):
        with torch.enable_grad(), model.hooks(fwd_hooks=fwd):
            values = run_objectives(model, tokens, mask, names)
        acts, out, err = store["acts_post"], store["output"], store["error"].detach()
        real = mask.to(acts.dtype)
        feats, b_decs, errs = [], [], []
        for k in range(len(names)):
            g_acts, g_out = torch.autograd.grad(values[:, k].sum(), [acts, out],
                                                retain_graph=k < len(names) - 1)
            feats.append(torch.einsum("bps,bp->bs", acts.detach() * g_acts, real))
            b_decs.append(torch.einsum("bpd,d,bp->b", g_out, sae.b_dec.detach(), real))
            errs.append(torch.einsum("bpd,bpd,bp->b", g_out, err, real))
    with torch.no_grad(), model.saes(saes=[sae], use_error_term=False):
        spliced = run_objectives(model, tokens, mask, names)
    pos = model.pool_positions(tokens, mask)
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    values = values.detach()
    return {"features": torch.stack(feats, -1), "b_dec": torch.stack(b_decs, -1),
            "error": torch.stack(errs, -1), "bias": torch.zeros_like(values),
            "reward": values, "gap": spliced - values, "acts": acts[rows, pos].detach(),
            "positions": pos, "scale": torch.full_like(values[:, 0], float("nan")),
            "objectives": names}


def resolve_method(model: Any, sae: Any, method: str) -> str:
    """``"exact"`` or ``"gradient"`` for ``method`` (``"auto"``: exact at the final residual)."""
    if method not in METHODS:
        raise SAEError(f"method must be one of {METHODS}, got {method!r}")
    hook = sae.cfg.metadata.hook_name
    if method == "auto":
        return "exact" if hook == final_hook(model) else "gradient"
    if method == "exact" and hook != final_hook(model):
        raise SAEError(
            f"an exact decomposition needs an SAE at the final residual {final_hook(model)!r}; "
            f"this SAE reads {hook!r}, where only the direct path is linear. Use "
            "method='gradient' and confirm the top features with ablation_check"
        )
    return method


def sae_attribution(
    model: Any,
    sae: Any,
    inputs: Any,
    objectives: ObjectiveSpec = None,
    method: str = "auto",
    batch_size: int = 8,
    progress: bool | None = None,
    step: StepSpec | None = None,
) -> SAEAttribution:
    """Attribute the reward of ``inputs`` to the features of a SAELens ``sae``.

    Args:
        model: a ``HookedSAERewardModel`` (a plain ``HookedRewardModel`` is wrapped) or a
            ``BridgeRewardModel`` (SAEs attached through SAELens's ``SAETransformerBridge``).
        sae: a SAELens SAE whose ``cfg.metadata.hook_name`` is a hook of ``model``.
        inputs: anything ``model.make_batch`` accepts.
        objectives: ``None`` (the reward, or ``"score"`` and every objective), a name or index,
            or a list of them.
        method: ``"auto"`` (exact at the final residual, gradient elsewhere), ``"exact"`` or
            ``"gradient"``.
        batch_size: inputs per forward pass.
        step: a process reward model's steps: one row per selected (input, step).
    """
    check_sae(model, sae)
    check_affine_sae(sae)
    method = resolve_method(model, sae, method)
    model = as_sae_model(model)
    items = as_items(inputs)
    if not items:
        raise SAEError("no inputs to attribute")
    encoded, step_rows = model.encode_steps(items, step)
    parts = []
    fn = _exact_batch if method == "exact" else _gradient_batch
    for batch in input_batches(model, encoded, batch_size, f"SAE attribution ({method})",
                               progress):
        parts.append(fn(model, sae, batch.tokens, batch.attention_mask, objectives))

    def cat(key: str) -> torch.Tensor:
        return torch.cat([p[key].detach().float().cpu() for p in parts])

    tokens = [model.tokenizer.convert_ids_to_tokens(e.ids) if model.tokenizer is not None
              else [str(t) for t in e.ids] for e in encoded]
    return SAEAttribution(
        hook_name=sae.cfg.metadata.hook_name, method=method, objectives=parts[0]["objectives"],
        features=cat("features"), b_dec=cat("b_dec"), error=cat("error"), bias=cat("bias"),
        reward=cat("reward"), reconstruction_gap=cat("gap"), activations=cat("acts"),
        positions=torch.cat([p["positions"].cpu() for p in parts]), scale=cat("scale"),
        tokens=tokens, steps=step_rows,
    )


def differential_sae_attribution(
    model: Any, sae: Any, pairs: Any, objectives: ObjectiveSpec = None, method: str = "auto",
    batch_size: int = 8, progress: bool | None = None,
    step: StepSpec | None = None,
) -> PairSAEAttribution:
    """:func:`sae_attribution` of both replies of each preference pair (``PreferencePair`` s,
    ``(prompt, chosen, rejected)`` tuples or a :class:`~tl_reward.data.pairs.PairBatch`)."""
    model = as_sae_model(model)  # wrapped once
    batch: PairBatch = as_pair_batch(model, pairs, step)
    kw: dict[str, Any] = dict(objectives=objectives, method=method, batch_size=batch_size,
                              progress=progress)
    return PairSAEAttribution(
        sae_attribution(model, sae, [torch.tensor(p.chosen_ids) for p in batch], **kw),
        sae_attribution(model, sae, [torch.tensor(p.rejected_ids) for p in batch], **kw),
    )
