"""Llama 2 / 3 / 3.1 / 3.2 sequence-classification reward models (Skywork, many RMs)."""

from __future__ import annotations

from typing import Any

from tl_reward.architectures.common import head_dim, require_false, rotary_fields
from tl_reward.architectures.registry import Architecture, register_architecture
from tl_reward.tl_backend import tl_converter


def llama_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig fields for a Llama-family config."""
    require_false(hf_config, "attention_bias", "mlp_bias")
    d_head = head_dim(hf_config)
    n_kv = hf_config.num_key_value_heads or hf_config.num_attention_heads
    return {
        "d_model": hf_config.hidden_size,
        "d_head": d_head,
        "n_heads": hf_config.num_attention_heads,
        "n_key_value_heads": n_kv if n_kv != hf_config.num_attention_heads else None,
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


LLAMA = register_architecture(
    Architecture(
        hf_class="LlamaForSequenceClassification",
        config=llama_config,
        convert=tl_converter("llama"),
        description="Llama 2/3/3.1/3.2 (Skywork-Reward-Llama, GRM-Llama, ...)",
    )
)
