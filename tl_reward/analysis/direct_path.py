"""Direct-path patching: swap one component's output on its direct path to the reward head only.

Every later component is frozen, so only the final residual at the pooled token changes:
``h' = h_tgt - o_c(tgt) + o_c(src)``. Two conventions for the final norm:

* ``scale="frozen"``: each run keeps its own final-norm scale, i.e. what is swapped is the
  component's contribution to the normed residual, ``o_c / s``. The patched objective moves by
  exactly ``a_c(src) - a_c(tgt)``: the DRA difference. This is the fair causal partner of DRA.
* ``scale="recompute"``: the final norm is applied afresh to ``h'`` (the direct effect through
  the norm's nonlinearity).

The effect is normalised as in :mod:`tl_reward.analysis.patching`: ``denoising`` (rejected
target, chosen source) gives ``(r' - r_rej) / Delta``; ``noising`` gives ``(r_ch - r') / Delta``.
ArmoRM's gate reads the shared prompt, which is the same in both replies, so ``w_eff`` is shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from tl_reward.analysis.components import final_components, merge_embed, pooled_run
from tl_reward.data.pairs import as_tokenized_pair
from tl_reward.errors import check_choice
from tl_reward.model.readout import (
    norm_scale,
    normalised_effect,
    resolve_objectives,
    reward_readout,
)
from tl_reward.model.steps import StepSpec
from tl_reward.results import CleanMargin, ShortRepr


@dataclass(repr=False)
class DirectPathResult(CleanMargin, ShortRepr):
    """Direct-path patching effects of every component of one pair.

    Attributes:
        names: component names; ``effect``: ``[C]`` normalised effects; ``patched``: ``[C]`` the
        target's patched objective; ``clean_chosen``/``clean_rejected``: clean values.
    """

    names: list[str]
    effect: torch.Tensor
    patched: torch.Tensor
    mode: str
    scale: str
    objective: str
    clean_chosen: float
    clean_rejected: float

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame({"component": self.names, "effect": self.effect.tolist(),
                             "patched": self.patched.tolist()})

    def plot(self) -> Any:
        import plotly.express as px

        return px.bar(self.to_dataframe(), x="component", y="effect",
                      title=f"Direct-path {self.mode} ({self.scale} scale, {self.objective})")


@torch.no_grad()
def direct_path_patching(
    model: Any,
    pair: Any,
    level: str = "sublayer",
    mode: str = "denoising",
    scale: str = "frozen",
    objective: int | str | None = None,
    step: StepSpec | None = None,
) -> DirectPathResult:
    """Direct-path patching of every component (``level`` ``"sublayer"`` or ``"head"``).

    Embedding terms are merged into one ``"embed"`` component (what ``hook_resid_pre`` of
    block 0 holds), so names match whole-sublayer activation patching.
    """
    check_choice(mode, ("denoising", "noising"), "direct-path patching mode")
    check_choice(scale, ("frozen", "recompute"), "scale")
    tp = as_tokenized_pair(model, pair, step)
    obj = resolve_objectives(model, objective)[0]
    runs = {}
    for side in ("chosen", "rejected"):
        tokens = tp.tokens(side).to(model.cfg.device)
        mask = torch.ones_like(tokens)
        positions = model.pool_positions(tokens, mask)
        cache = pooled_run(model, tokens, mask, positions)
        resid = cache.full[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
        ro = reward_readout(model, resid, tokens, mask, obj, positions)
        comps = final_components(model, cache, ro.positions)
        stack, names = comps.stack(level)
        stack, names = merge_embed(stack[0], names, len(comps.embed_names))
        runs[side] = (ro, stack, comps.resid[0])
    tgt, src = ("rejected", "chosen") if mode == "denoising" else ("chosen", "rejected")
    ro_t, o_t, h_t = runs[tgt]
    ro_s, o_s, _ = runs[src]
    w, b = ro_t.directions[0, 0], float(ro_t.bias[0, 0])
    r_t = float(ro_t.reward[0, 0])
    if scale == "frozen":
        a_t = o_t @ w / ro_t.scale[0]
        a_s = o_s @ ro_s.directions[0, 0] / ro_s.scale[0]
        patched = r_t + a_s - a_t
    else:
        h_new = h_t[None] + o_s - o_t  # [C, d_model]
        patched = h_new @ w / norm_scale(model, h_new)[:, 0] + b
    r_c, r_r = (float(runs[side][0].reward[0, 0]) for side in ("chosen", "rejected"))
    effect = normalised_effect(patched - r_r if mode == "denoising" else r_c - patched, r_c - r_r)
    return DirectPathResult(names, effect.cpu(), patched.cpu(), mode, scale, obj,
                            r_c, r_r)
