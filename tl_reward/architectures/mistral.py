"""Mistral sequence-classification reward models (sliding-window attention)."""

from __future__ import annotations

from typing import Any

from tl_reward.architectures.common import head_dim, rotary_fields
from tl_reward.architectures.registry import Architecture, register_architecture
from tl_reward.tl_backend import tl_converter


def mistral_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig fields for a Mistral config."""
    d_head = head_dim(hf_config)
    window = getattr(hf_config, "sliding_window", None)
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
        "use_local_attn": bool(window),
        "window_size": window,
        "attn_types": ["local"] * hf_config.num_hidden_layers if window else None,
        "normalization_type": "RMS",
        "final_rms": True,
        "gated_mlp": True,
        **rotary_fields(hf_config, d_head),
    }


MISTRAL = register_architecture(
    Architecture(
        hf_class="MistralForSequenceClassification",
        config=mistral_config,
        convert=tl_converter("mistral"),
        description="Mistral 7B reward models",
    )
)
