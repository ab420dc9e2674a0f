"""Running a reward model with a SAELens SAE: checks, decoder directions, objective values.

Shared by :mod:`tl_reward.sae.attribution`, :mod:`tl_reward.sae.ablation` and
:mod:`tl_reward.sae.features`. SAEs are attached through SAELens's own
``HookedSAETransformer.saes`` context manager (``SAETransformerBridge.saes`` on a bridge), so
the hook names are SAELens's, as ``model.get_sae_hook_name(sae, internal)`` names them:
``hook_sae_acts_post`` (features ``f``), ``hook_sae_error`` (``x - x_hat``),
``hook_sae_output`` (under the bridge's own name of the hook, ``blocks.L.hook_out``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int

from tl_reward import tl_backend
from tl_reward.errors import SAEError
from tl_reward.model.readout import objective_at_pooled


def final_hook(model: Any) -> str:
    """The hook whose SAE features decompose the reward exactly: the last block's
    ``hook_resid_post`` (the residual the final norm and head read)."""
    return f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"


def as_sae_model(model: Any) -> Any:
    """``model`` ready for SAELens SAEs: a plain ``HookedRewardModel`` as a
    :class:`~tl_reward.model.hooked_sae_reward_model.HookedSAERewardModel` (rebuilt around the
    same parameter tensors, no copy), a ``TransformerBridge`` as SAELens's
    ``SAETransformerBridge`` too (:func:`tl_reward.tl_backend.bridge.sae_bridge`, sharing its
    modules)."""
    from tl_reward.model.hooked_sae_reward_model import HookedSAERewardModel

    if tl_backend.is_bridge(model):
        return tl_backend.sae_bridge(model)
    return HookedSAERewardModel.from_reward_model(model)


def check_sae(model: Any, sae: Any) -> str:
    """The hook ``sae`` reads, after checking that it fits ``model`` (see
    ``HookedSAERewardModel.check_sae``, which reads only the hooks and config it names)."""
    from tl_reward.model.hooked_sae_reward_model import HookedSAERewardModel

    return HookedSAERewardModel.check_sae(as_sae_model(model), sae)


def check_affine_sae(sae: Any) -> None:
    """Raise unless the SAE decodes ``f W_dec' + b_dec`` with fixed weights (an exact split)."""
    norm = sae.cfg.normalize_activations
    if norm in ("constant_norm_rescale", "layer_norm"):
        raise SAEError(
            f"this SAE normalises activations at run time (normalize_activations={norm!r}), so "
            "its reconstruction is not a fixed sum of feature directions; use an SAE trained "
            "with normalize_activations='none' or 'expected_average_only_in' (SAELens folds "
            "that scale into the weights after training)"
        )
    if sae.cfg.reshape_activations != "none":
        raise SAEError(
            f"SAEs with reshape_activations={sae.cfg.reshape_activations!r} (hook_z) are not "
            "supported by the SAE analyses yet; use a residual-stream or MLP-output SAE"
        )


def decoder_directions(sae: Any) -> Float[torch.Tensor, "d_sae d_in"]:
    """What one unit of each feature writes: ``W_dec`` rows, divided by their norms when the SAE
    rescales activations by decoder norm (SAELens's TopK ``rescale_acts_by_decoder_norm``)."""
    w = sae.W_dec
    if getattr(sae.cfg, "rescale_acts_by_decoder_norm", False):
        w = w / w.norm(dim=-1, keepdim=True)
    return w


def run_objectives(
    model: Any, tokens: Int[torch.Tensor, "batch pos"], mask: Int[torch.Tensor, "batch pos"],
    names: Sequence[str], resid: Float[torch.Tensor, "batch pos d_model"] | None = None,
    start_at_layer: int | None = None,
) -> Float[torch.Tensor, "batch n_obj"]:
    """One forward pass (with whatever SAEs and hooks are attached) giving each named objective
    (``"score"`` or an objective name) at the pooled token, through the shared readout (float32
    at least; differentiable, ArmoRM's gate included); from ``resid`` entering block
    ``start_at_layer`` when given."""
    n_layers = model.cfg.n_layers
    if resid is None:
        final = model.final_residual(tokens, mask)
    else:
        final = model(resid, start_at_layer=start_at_layer, tokens=tokens, attention_mask=mask,
                      stop_at_layer=n_layers)
    return objective_at_pooled(model, final, tokens, mask, list(names))


def restart_layer(model: Any, hook: str) -> int | None:
    """``L`` for ``blocks.L.hook_resid_post`` where ``model`` can restart a run after it (not
    on a bridge: ``starts_at_layer``), else None."""
    m = re.fullmatch(r"blocks\.(\d+)\.hook_resid_post", hook)
    return int(m.group(1)) if m and model.starts_at_layer else None
