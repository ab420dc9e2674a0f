"""TransformerLens configs, weight conversion with the reward head as ``lm_head``, and weight
processing a block at a time.

TransformerLens 3's own parts (``HookedTransformerConfig``, its converters and norms) are
imported where used: TransformerLens 4 removed them, and the architecture registry, which the
bridge reads, must import there."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from transformer_lens import HookedTransformerConfig

_CONVERTERS = {
    "llama": ("transformer_lens.pretrained.weight_conversions.llama", "convert_llama_weights"),
    "mistral": (
        "transformer_lens.pretrained.weight_conversions.mistral",
        "convert_mistral_weights",
    ),
    "gemma": ("transformer_lens.pretrained.weight_conversions.gemma", "convert_gemma_weights"),
    "qwen2": ("transformer_lens.pretrained.weight_conversions.qwen2", "convert_qwen2_weights"),
    "qwen3": ("transformer_lens.pretrained.weight_conversions.qwen3", "convert_qwen3_weights"),
    "gpt2": ("transformer_lens.pretrained.weight_conversions.gpt2", "convert_gpt2_weights"),
}


class _HeadAsLMHead:
    """A view of an HF model whose ``lm_head`` is the reward head (TL converters read it)."""

    def __init__(self, hf_model: nn.Module, head: nn.Linear) -> None:
        self._hf_model = hf_model
        self.lm_head = head

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hf_model, name)


def tl_converter(name: str) -> Callable[[nn.Module, HookedTransformerConfig], dict[str, Any]]:
    """A TransformerLens weight converter by family name, applied with the head as ``lm_head``.

    The returned function takes ``(hf_model, cfg)`` where ``hf_model`` may be wrapped so that
    ``lm_head`` is the reward layer; the ``unembed.*`` entries it writes are replaced by the
    loader afterwards. TransformerLens's converter is imported at the first call.
    """
    module_name, fn_name = _CONVERTERS[name]

    def convert(hf_model: nn.Module, cfg: HookedTransformerConfig) -> dict[str, Any]:
        return getattr(importlib.import_module(module_name), fn_name)(hf_model, cfg)

    convert.__name__ = f"convert_{name}"
    return convert


def make_config(**fields: Any) -> HookedTransformerConfig:
    """A ``HookedTransformerConfig`` with reward-model defaults (no weight init)."""
    from transformer_lens import HookedTransformerConfig

    fields.setdefault("init_weights", False)
    return HookedTransformerConfig(**fields)


def convert_state_dict(
    convert: Callable[[Any, HookedTransformerConfig], dict[str, Any]],
    hf_model: nn.Module,
    head: nn.Linear,
    cfg: HookedTransformerConfig,
) -> dict[str, torch.Tensor]:
    """The TransformerLens state dict of ``hf_model`` with ``unembed`` = the reward head."""
    state_dict = dict(convert(_HeadAsLMHead(hf_model, head), cfg))
    weight = head.weight.detach()
    state_dict["unembed.W_U"] = weight.T.to(cfg.dtype).contiguous()
    bias = head.bias.detach() if head.bias is not None else torch.zeros(weight.shape[0])
    state_dict["unembed.b_U"] = bias.to(device=weight.device, dtype=cfg.dtype)
    return state_dict


PROCESSING = dict(fold_ln=True, center_writing_weights=True, center_unembed=False,
                  fold_value_biases=True, refactor_factored_attn_matrices=False)
"""The folds tl_reward uses: ``fold_ln`` puts the final norm's gain into the head,
``center_writing_weights`` and ``fold_value_biases`` keep TransformerLens's usual conventions.
Centring the unembedding would zero a one-column reward head, so it stays off."""


def process_weights_stock(model: Any, state_dict: dict[str, torch.Tensor],
                          release: Callable[[int], None] | None = None,
                          device: str | torch.device | None = None) -> None:
    """TransformerLens's own ``load_and_process_state_dict`` with :data:`PROCESSING`.

    It upcasts the whole state dict to float32 and clones all of it at every step: the reference
    that :func:`process_weights` is tested against, bit for bit (``release`` and ``device`` are
    accepted for the same signature and ignored: the loader moves the model at the end).
    """
    model.load_and_process_state_dict(state_dict, **PROCESSING)


def _use_pre_norms(model: Any) -> None:
    """Swap the folded norms for their weightless ``*Pre`` forms, as ``fold_ln`` does."""
    from transformer_lens.components import LayerNormPre, RMSNormPre

    cfg = model.cfg
    kinds = {"LN": (LayerNormPre, "LNPre"), "RMS": (RMSNormPre, "RMSPre")}
    if cfg.normalization_type not in kinds:
        return
    norm, cfg.normalization_type = kinds[cfg.normalization_type]
    model.ln_final = norm(cfg)
    for block in model.blocks:
        block.ln1, block.ln2 = norm(cfg), norm(cfg)
        if cfg.is_layer_norm_activation():
            block.mlp.ln = norm(cfg)


def cpu_config(cfg: HookedTransformerConfig) -> HookedTransformerConfig:
    """A copy of ``cfg`` on the CPU: converters and weight processing run there (converters
    create tensors on ``cfg.device``), and each block moves to the model's device once loaded."""
    out = copy.copy(cfg)
    out.device = "cpu"
    return out


def _process(state_dict: dict[str, torch.Tensor], cfg: HookedTransformerConfig
             ) -> dict[str, torch.Tensor]:
    """TransformerLens's ``ProcessWeights.process_weights`` with :data:`PROCESSING`; for a
    float64 model its steps in float64, on the weights made float64 first: it rounds every
    tensor that is not float32 to float32 and back (an upcast meant for bf16), and a float32
    HF model's weights arrive float32, so float32 rounding went into every folded or centred
    weight of a float64 model (rewards 1e-7 relative from HF's float64 forward)."""
    from transformer_lens.weight_processing import ProcessWeights as PW

    if cfg.dtype != torch.float64:
        return PW.process_weights(state_dict, cfg, **PROCESSING)
    state_dict = {k: v.double() if v.is_floating_point() else v  # the converters keep HF's
                  for k, v in state_dict.items()}                # dtype (float32, say)
    layer_norm = cfg.normalization_type in ("LN", "LNPre")
    if layer_norm or cfg.normalization_type in ("RMS", "RMSPre"):  # fold_ln
        state_dict = PW.fold_layer_norm(state_dict, cfg, fold_biases=layer_norm,
                                        center_weights=layer_norm)
    if layer_norm and not cfg.final_rms:  # center_writing_weights
        state_dict = PW.center_writing_weights(state_dict, cfg)
    state_dict = PW.fold_value_biases(state_dict, cfg)
    if layer_norm:  # the folded b_O centred too, as process_weights does
        for layer in range(cfg.n_layers):
            key = f"blocks.{layer}.attn.b_O"
            if key in state_dict:
                state_dict[key] = state_dict[key] - state_dict[key].mean()
    return state_dict


def process_weights(
    model: Any,
    state_dict: dict[str, torch.Tensor],
    release: Callable[[int], None] | None = None,
    device: str | torch.device | None = None,
) -> None:
    """Load ``state_dict`` into ``model`` with :data:`PROCESSING`, one block at a time.

    The same result as :func:`process_weights_stock`, bit for bit, but each block's weights are
    processed (TransformerLens's ``ProcessWeights`` on a one-layer view) and loaded before the
    next, so peak memory is the model plus one block (or the embeddings) in float32 instead of
    several float32 copies of the whole model. Entries are popped from ``state_dict``.

    ``device``: each block moves there as soon as it is loaded (so host memory never holds the
    whole converted model when it goes to a GPU). ``release(layer)`` is called after block
    ``layer`` is loaded, to free the source weights it came from.
    """

    cfg = model.cfg
    state_dict = model.fill_missing_keys(state_dict)
    _use_pre_norms(model)
    one_layer = cpu_config(cfg)
    one_layer.n_layers = 1
    shared = {k: v for k, v in state_dict.items() if not k.startswith("blocks.")}
    # later blocks need embedding keys only because centring the writing weights reads them
    # (their outputs are dropped): one row each, not a float32 copy of the whole vocabulary
    embeddings = {k: v[:1] for k, v in shared.items() if k.startswith(("embed.", "pos_embed."))}
    for layer in range(cfg.n_layers):
        prefix = f"blocks.{layer}."
        group = {"blocks.0." + k[len(prefix):]: state_dict.pop(k)
                 for k in [k for k in state_dict if k.startswith(prefix)]}
        # block 0 carries the embeddings and head; later blocks see the embeddings only because
        # centring the writing weights reads them (their outputs are dropped)
        group.update(shared if layer == 0 else embeddings)
        processed = _process(group, one_layer)
        del group
        block = {k[len("blocks.0."):]: processed.pop(k) for k in list(processed)
                 if k.startswith("blocks.0.")}
        # as in TransformerLens, folded norm weights (now ones) have no parameter and are skipped
        model.blocks[layer].load_state_dict(block, strict=False)
        if layer == 0:
            model.load_state_dict(processed, strict=False)
        del block, processed
        if device is not None:
            model.blocks[layer].to(device)
        if release is not None:
            release(layer)
    model.setup()
