"""Llama 2 / 3 / 3.1 / 3.2 sequence-classification reward models (Skywork, many RMs)."""

from __future__ import annotations

from typing import Any

from tl_reward.architectures.common import gated_rms_fields, require_false
from tl_reward.architectures.registry import Architecture, register_architecture
from tl_reward.tl_backend import tl_converter


def llama_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig fields for a Llama-family config."""
    require_false(hf_config, "attention_bias", "mlp_bias")
    return gated_rms_fields(hf_config)


LLAMA = register_architecture(
    Architecture(
        hf_class="LlamaForSequenceClassification",
        config=llama_config,
        convert=tl_converter("llama"),
        description="Llama 2/3/3.1/3.2 (Skywork-Reward-Llama, GRM-Llama, ...)",
    )
)
