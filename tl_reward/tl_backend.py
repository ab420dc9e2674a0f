"""Everything that touches TransformerLens internals lives here, so a TransformerBridge
backend can replace this one module.

What it does: builds ``HookedTransformerConfig`` objects, calls TransformerLens's weight
converters with the reward head standing in for ``lm_head``, and exposes the key/value cache
classes used by the vocabulary sweep.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformer_lens import HookedTransformerConfig

_CONVERTERS = {
    "llama": ("transformer_lens.pretrained.weight_conversions.llama", "convert_llama_weights"),
    "mistral": (
        "transformer_lens.pretrained.weight_conversions.mistral",
        "convert_mistral_weights",
    ),
    "gemma": ("transformer_lens.pretrained.weight_conversions.gemma", "convert_gemma_weights"),
    "qwen2": ("transformer_lens.pretrained.weight_conversions.qwen2", "convert_qwen2_weights"),
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
    loader afterwards.
    """
    module_name, fn_name = _CONVERTERS[name]
    fn = getattr(importlib.import_module(module_name), fn_name)

    def convert(hf_model: nn.Module, cfg: HookedTransformerConfig) -> dict[str, Any]:
        return fn(hf_model, cfg)

    convert.__name__ = f"convert_{name}"
    return convert


def make_config(**fields: Any) -> HookedTransformerConfig:
    """A ``HookedTransformerConfig`` with reward-model defaults (no weight init)."""
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


def process_weights(model: Any, state_dict: dict[str, torch.Tensor]) -> None:
    """Load ``state_dict`` with the folds tl_reward uses; never ``center_unembed``.

    ``fold_ln`` puts the final norm's gain into the head, ``center_writing_weights`` and
    ``fold_value_biases`` keep TransformerLens's usual conventions. Centring the unembedding
    would zero a one-column reward head, so it stays off.
    """
    model.load_and_process_state_dict(
        state_dict,
        fold_ln=True,
        center_writing_weights=True,
        center_unembed=False,
        fold_value_biases=True,
        refactor_factored_attn_matrices=False,
    )
