"""Gemma-2 sequence-classification reward models (Skywork-Reward-Gemma-2, ...).

HF's sequence-classification head applies no final logit soft-cap, so none is set here;
attention-score soft-capping and the sandwich norms are kept.
"""

from __future__ import annotations

import math
from typing import Any

from tl_reward.architectures.common import gated_rms_fields
from tl_reward.architectures.registry import Architecture, register_architecture
from tl_reward.tl_backend import tl_converter


def gemma2_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig fields for a Gemma-2 config."""
    n = hf_config.num_hidden_layers
    layer_types = getattr(hf_config, "layer_types", None) or [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)
    ]
    attn_types = ["local" if t == "sliding_attention" else "global" for t in layer_types]
    softcap = getattr(hf_config, "attn_logit_softcapping", None)
    out: dict[str, Any] = {
        **gated_rms_fields(hf_config),
        "n_key_value_heads": hf_config.num_key_value_heads,
        "use_normalization_before_and_after": True,
        "use_attn_scale": True,
        "attn_scale": math.sqrt(hf_config.query_pre_attn_scalar),
        "use_local_attn": True,
        "window_size": hf_config.sliding_window,
        "attn_types": attn_types,
    }
    if softcap:
        out["attn_scores_soft_cap"] = float(softcap)
    return out


GEMMA2 = register_architecture(
    Architecture(
        hf_class="Gemma2ForSequenceClassification",
        config=gemma2_config,
        convert=tl_converter("gemma"),
        hf_load_kwargs={"attn_implementation": "eager"},
        description="Gemma-2 reward models (Skywork-Reward-Gemma-2-27B, ...)",
    )
)
