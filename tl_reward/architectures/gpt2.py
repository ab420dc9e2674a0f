"""GPT-2 sequence-classification reward models (LayerNorm, learned positions)."""

from __future__ import annotations

from typing import Any

from tl_reward.architectures.registry import Architecture, register_architecture
from tl_reward.tl_backend import tl_converter


def gpt2_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig fields for a GPT-2 config."""
    return {
        "d_model": hf_config.n_embd,
        "d_head": hf_config.n_embd // hf_config.n_head,
        "n_heads": hf_config.n_head,
        "d_mlp": hf_config.n_inner or 4 * hf_config.n_embd,
        "n_layers": hf_config.n_layer,
        "n_ctx": hf_config.n_positions,
        "eps": hf_config.layer_norm_epsilon,
        "d_vocab": hf_config.vocab_size,
        "act_fn": hf_config.activation_function,
        "use_attn_scale": getattr(hf_config, "scale_attn_weights", True),
        "scale_attn_by_inverse_layer_idx": hf_config.scale_attn_by_inverse_layer_idx,
        "normalization_type": "LN",
        "positional_embedding_type": "standard",
    }


GPT2 = register_architecture(
    Architecture(
        hf_class="GPT2ForSequenceClassification",
        config=gpt2_config,
        convert=tl_converter("gpt2"),
        description="GPT-2 reward models",
    )
)
