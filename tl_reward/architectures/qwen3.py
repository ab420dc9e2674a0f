"""Qwen3 sequence-classification reward models (the Skywork-Reward-V2 Qwen3 series).

Qwen3 differs from Qwen2 in two ways that matter here: q/k projections have no bias, and each
head's query and key are RMS-normalised (``q_norm``/``k_norm`` over ``head_dim``, with a gain)
before the rotary embedding. TransformerLens's ``use_qk_norm`` applies the same per-head norm
inside ``calculate_qkv_matrices``; the head size is the config's ``head_dim`` (128 for every
Qwen3 size, which is not ``hidden_size / num_attention_heads`` for most of them).
"""

from __future__ import annotations

from typing import Any

from tl_reward.architectures.common import gated_rms_fields, require_false
from tl_reward.architectures.registry import Architecture, register_architecture
from tl_reward.errors import UnsupportedArchitectureError
from tl_reward.tl_backend import tl_converter


def qwen3_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig fields for a Qwen3 config."""
    require_false(hf_config, "attention_bias")
    if getattr(hf_config, "use_sliding_window", False):
        raise UnsupportedArchitectureError(
            "Qwen3 with use_sliding_window=True is not supported (its per-layer window "
            "schedule has no TransformerLens equivalent yet)"
        )
    return {**gated_rms_fields(hf_config), "use_qk_norm": True}


QWEN3 = register_architecture(
    Architecture(
        hf_class="Qwen3ForSequenceClassification",
        config=qwen3_config,
        convert=tl_converter("qwen3"),
        description="Qwen3 reward models (Skywork-Reward-V2-Qwen3-0.6B/1.7B/4B/8B)",
    )
)
