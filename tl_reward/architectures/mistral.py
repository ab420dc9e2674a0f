"""Mistral sequence-classification reward models (sliding-window attention)."""

from __future__ import annotations

from typing import Any

from tl_reward.architectures.common import gated_rms_fields
from tl_reward.architectures.registry import Architecture, register_architecture
from tl_reward.tl_backend import tl_converter


def mistral_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig fields for a Mistral config."""
    window = getattr(hf_config, "sliding_window", None)
    return {**gated_rms_fields(hf_config),
            "n_key_value_heads": hf_config.num_key_value_heads,
            "use_local_attn": bool(window),
            "window_size": window,
            "attn_types": ["local"] * hf_config.num_hidden_layers if window else None}


MISTRAL = register_architecture(
    Architecture(
        hf_class="MistralForSequenceClassification",
        config=mistral_config,
        convert=tl_converter("mistral"),
        description="Mistral 7B reward models",
    )
)
