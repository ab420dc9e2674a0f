"""Attribution patching: first-order estimates of every patch from one forward and backward.

For a site with activation ``a``, patching the source's value into the target run changes the
objective by about ``(a_src - a_tgt) . dr/da |_tgt``. Chosen and rejected run together in one
padded batch, and one backward pass gives the gradients in both, so both directions come out
of a single forward and backward per pair, for all sites at once:

* denoising (rejected target): ``(a_ch - a_rej) . dr/da|_rej / Delta``;
* noising (chosen target): ``(a_ch - a_rej) . dr/da|_ch / Delta``,

summed over the aligned positions a patch writes (and over ``d_head`` for a head), normalised
as in :mod:`tl_reward.analysis.patching`. The objective is read at the pooled token of the
model's rule through the shared readout, so positions after it get exactly 0; products are
accumulated in float32 whatever the weights' dtype. As the patch shrinks, the estimate equals
the finite difference (tested against ``activation_patching(..., fraction=eps)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.analysis.components import has_neurons, stack_components
from tl_reward.data.pairs import as_tokenized_pair
from tl_reward.model.readout import (
    accumulation_dtype,
    normalised_effect,
    objective_at_pooled,
    resolve_objectives,
)
from tl_reward.model.steps import StepSpec
from tl_reward.results import CleanMargin, ShortRepr


@dataclass(repr=False)
class AttributionPatchingResult(CleanMargin, ShortRepr):
    """First-order patching estimates for one pair, per direction (``"denoising"``,
    ``"noising"``).

    Attributes:
        resid: ``[layer + 1, position]`` (the last layer is the final residual).
        attn_out, mlp_out: ``[layer, position]``; ``head``: ``[layer, head, position]``.
        neuron: ``[layer, d_mlp]`` (summed over aligned positions; ``[layer, 0]`` for a
            mixture-of-experts MLP, which has no one set of neurons).
        position_labels: names of the aligned positions.
        clean_chosen, clean_rejected: clean objective values.
    """

    objective: str
    resid: dict[str, Float[torch.Tensor, "layer1 position"]]
    attn_out: dict[str, Float[torch.Tensor, "layer position"]]
    mlp_out: dict[str, Float[torch.Tensor, "layer position"]]
    head: dict[str, Float[torch.Tensor, "layer head position"]]
    neuron: dict[str, Float[torch.Tensor, "layer d_mlp"]]
    position_labels: list[str]
    clean_chosen: float
    clean_rejected: float

    def components(self, level: str = "sublayer", mode: str = "denoising"
                   ) -> tuple[torch.Tensor, list[str]]:
        """Whole-sequence estimates per component, named as in direct-path patching:
        ``embed``, then per layer ``attn`` (or each head and ``attn_bias``, which no patch
        changes: 0) and ``mlp``."""
        mlp = self.mlp_out[mode].sum(-1)[None]
        parts = SimpleNamespace(embed=self.resid[mode][0].sum().reshape(1, 1), mlp=mlp,
                                embed_names=["embed"], heads=self.head[mode].sum(-1)[None],
                                attn=self.attn_out[mode].sum(-1)[None],
                                attn_bias=torch.zeros_like(mlp))
        vals, names = stack_components(parts, "sublayer" if level == "sublayer" else "head")
        return vals[0], names

    def to_dataframe(self, level: str = "head") -> pd.DataFrame:
        """Whole-sequence estimates per component, both directions."""
        d, names = self.components(level, "denoising")
        n, _ = self.components(level, "noising")
        return pd.DataFrame({"component": names, "denoising": d.tolist(), "noising": n.tolist()})

    def plot(self, site: str = "resid", mode: str = "denoising") -> Any:
        """Heatmap of one site's estimates (layer x position, or layer x head summed)."""
        from tl_reward.viz.patching import heatmap

        vals = getattr(self, site)[mode]
        if site == "head":
            return heatmap(vals.sum(-1), "head", "layer",
                           f"Attribution patching ({mode}), heads")
        if site == "neuron":
            return heatmap(vals, "neuron", "layer", f"Attribution patching ({mode}), neurons")
        return heatmap(vals, "position", "layer", f"Attribution patching ({mode}), {site}",
                       x_labels=self.position_labels)


SITE_HOOKS = {"resid": "hook_resid_pre", "attn_out": "hook_attn_out",
              "mlp_out": "hook_mlp_out", "head": "attn.hook_z", "neuron": "mlp.hook_post"}


def attribution_patching(
    model: Any, pair: Any, objective: int | str | None = None, step: StepSpec | None = None,
) -> AttributionPatchingResult:
    """First-order estimates of denoising and noising at every site of one preference pair,
    from one forward and one backward pass (chosen and rejected batched). ``step``: a process
    reward model's pair of solutions ``(a, b)`` compared at that step's tag."""
    tp = as_tokenized_pair(model, pair, step)
    obj = resolve_objectives(model, objective)[0]
    n_layers = model.cfg.n_layers
    final_hook = f"blocks.{n_layers - 1}.hook_resid_post"
    lengths = [tp.chosen_len, tp.rejected_len]
    n = max(lengths)
    tokens = torch.full((2, n), int(model.pad_token_id or 0), dtype=torch.long)
    mask = torch.zeros((2, n), dtype=torch.long)
    for i, side in enumerate(("chosen", "rejected")):
        tokens[i, : lengths[i]] = torch.tensor(tp.ids(side))
        mask[i, : lengths[i]] = 1
    tokens, mask = tokens.to(model.cfg.device), mask.to(model.cfg.device)
    rows_c = tp.aligned[:, 0].to(tokens.device)
    rows_r = tp.aligned[:, 1].to(tokens.device)
    acc = accumulation_dtype(model)
    # Memory: nothing gradient-carrying is kept. Each site's forward hook keeps only the
    # source-minus-target difference on the aligned rows and registers a gradient hook that
    # reduces the gradient to the estimate as soon as backward reaches that layer.
    raw: dict[str, dict[str, torch.Tensor]] = {}
    leaf: list[torch.Tensor] = []

    def on_grad(name: str, diff: torch.Tensor, kind: str) -> Any:
        def fn(g: torch.Tensor) -> None:
            out = {}
            for mode, gg in (("denoising", g[1, rows_r]), ("noising", g[0, rows_c])):
                prod = diff * gg.detach().to(acc)
                out[mode] = (prod.sum(0) if kind == "neuron" else prod.sum(-1)).cpu()
            raw[name] = out
        return fn

    def start(act: torch.Tensor, hook: Any) -> torch.Tensor:
        x = act.detach().requires_grad_(True)  # differentiate from here on, not the weights
        leaf.append(x)
        return x + 0

    def save(kind: str, name: str) -> Any:  # name as asked (a bridge names its aliases)
        def fn(act: torch.Tensor, hook: Any) -> torch.Tensor:
            a = act.detach()
            act.register_hook(on_grad(name, (a[0, rows_c] - a[1, rows_r]).to(acc), kind))
            return act  # returned: a bridge hands its hook a reshaped view (attn.hook_z) and
            # uses it downstream only when it is returned, or no gradient reaches it
        return fn

    neurons = has_neurons(model)
    sites = [(kind, f"blocks.{layer}.{h}") for layer in range(n_layers)
             for kind, h in SITE_HOOKS.items() if neurons or kind != "neuron"
             ] + [("resid", final_hook)]
    fwd = [("hook_embed", start), *((name, save(kind, name)) for kind, name in sites)]
    with torch.enable_grad(), model.hooks(fwd_hooks=fwd):
        resid = model.final_residual(tokens, mask)
        values = objective_at_pooled(model, resid, tokens, mask, [obj])[:, 0]
        del resid
        torch.autograd.grad(values.sum(), leaf)
    r_c, r_r = (float(v) for v in values.detach())
    per_delta = normalised_effect(torch.ones((), dtype=acc), r_c - r_r, "estimates")

    def stack(key: str, *extra: str) -> dict[str, torch.Tensor]:
        names = [*(f"blocks.{layer}.{SITE_HOOKS[key]}" for layer in range(n_layers)), *extra]
        return {m: torch.stack([raw[nm][m] for nm in names]) * per_delta
                for m in ("denoising", "noising")}

    resid_est = stack("resid", final_hook)  # [layer + 1, pos]
    attn, mlp = stack("attn_out"), stack("mlp_out")
    head = {m: v.transpose(1, 2) for m, v in stack("head").items()}  # [layer, head, pos]
    neuron = stack("neuron") if neurons else {  # [layer, d_mlp], summed over aligned positions
        m: torch.zeros(n_layers, 0, dtype=acc) for m in ("denoising", "noising")}
    return AttributionPatchingResult(obj, resid_est, attn, mlp, head, neuron,
                                     tp.position_labels(model.tokenizer), r_c, r_r)
