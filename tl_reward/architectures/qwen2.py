"""Qwen2 / Qwen2.5 sequence-classification reward models (biased q/k/v)."""

from __future__ import annotations

from typing import Any

from tl_reward.architectures.common import head_dim, rotary_fields
from tl_reward.architectures.registry import Architecture, register_architecture
from tl_reward.errors import UnsupportedArchitectureError
from tl_reward.tl_backend import tl_converter


def qwen2_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig fields for a Qwen2 config."""
    if getattr(hf_config, "use_sliding_window", False):
        raise UnsupportedArchitectureError(
            "Qwen2 with use_sliding_window=True is not supported (its per-layer window "
            "schedule has no TransformerLens equivalent yet)"
        )
    d_head = head_dim(hf_config)
    return {
        "d_model": hf_config.hidden_size,
        "d_head": d_head,
        "n_heads": hf_config.num_attention_heads,
        "n_key_value_heads": hf_config.num_key_value_heads,
        "d_mlp": hf_config.intermediate_size,
        "n_layers": hf_config.num_hidden_layers,
        "n_ctx": hf_config.max_position_embeddings,
        "eps": hf_config.rms_norm_eps,
        "d_vocab": hf_config.vocab_size,
        "act_fn": hf_config.hidden_act,
        "normalization_type": "RMS",
        "final_rms": True,
        "gated_mlp": True,
        **rotary_fields(hf_config, d_head),
    }


QWEN2 = register_architecture(
    Architecture(
        hf_class="Qwen2ForSequenceClassification",
        config=qwen2_config,
        convert=tl_converter("qwen2"),
        description="Qwen2 / Qwen2.5 reward models",
    )
)
