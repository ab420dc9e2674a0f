"""Qwen2 / Qwen2.5 sequence-classification reward models (biased q/k/v)."""

from __future__ import annotations

from typing import Any

from tl_reward.architectures.common import gated_rms_fields
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
    return {**gated_rms_fields(hf_config),
            "n_key_value_heads": hf_config.num_key_value_heads}


QWEN2 = register_architecture(
    Architecture(
        hf_class="Qwen2ForSequenceClassification",
        config=qwen2_config,
        convert=tl_converter("qwen2"),
        description="Qwen2 / Qwen2.5 reward models",
    )
)
